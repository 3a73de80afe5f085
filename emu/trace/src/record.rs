//! [`Record`]: one line of a trace file written by [`crate::JsonLayer`].

use serde_json::{Map, Value};

/// A line that is not a trace record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError(pub String);

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RecordError {}

/// One trace event: its wall time, process, `kind` and all its fields (span fields included).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Wall-clock time in ns since the Unix epoch.
    pub t: u64,
    /// The emitting process.
    pub pid: u32,
    /// The `kind` field ([`crate::kind`]); empty for an event without one.
    pub kind: String,
    /// Every field of the line.
    pub fields: Map<String, Value>,
}

impl Record {
    /// Parses one line. Errors: not a JSON object, or no numeric `t`.
    pub fn parse(line: &str) -> Result<Record, RecordError> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| RecordError(format!("not JSON: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(RecordError("not a JSON object".into()));
        };
        let t = fields
            .get("t")
            .and_then(Value::as_u64)
            .ok_or_else(|| RecordError("no numeric \"t\" field".into()))?;
        let pid = fields
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0);
        let kind = fields
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(Record {
            t,
            pid,
            kind,
            fields,
        })
    }

    /// A numeric field.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.fields.get(name).and_then(Value::as_u64)
    }

    /// A field as text (strings as they are, other values in JSON).
    pub fn text(&self, name: &str) -> Option<String> {
        match self.fields.get(name)? {
            Value::String(s) => Some(s.clone()),
            v => Some(v.to_string()),
        }
    }

    /// A boolean field.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.fields.get(name).and_then(Value::as_bool)
    }
}
