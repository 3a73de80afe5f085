//! [`JsonLayer`]: a `tracing` layer that writes each event as one JSON object per line.

use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Writes every event it sees as a JSON line:
/// `{"t":UNIX_NS,"pid":P,"level":"DEBUG","target":"emu_proto::hca","kind":"pkt.tx",
/// "dev":…,"addr":…,"now":…,"qp":…, …event fields}`.
///
/// The fields of the spans the event is in (outermost first) come before the event's own;
/// an event field of the same name wins. `message` is kept as `msg`. Each line is written
/// and flushed on its own, so a killed process loses at most the line being written. A write
/// error is ignored: tracing must not fail the traced program.
pub struct JsonLayer {
    out: Mutex<Box<dyn Write + Send>>,
    pid: u32,
}

impl std::fmt::Debug for JsonLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLayer").field("pid", &self.pid).finish()
    }
}

impl JsonLayer {
    /// A layer writing to `out`.
    pub fn new(out: impl Write + Send + 'static) -> JsonLayer {
        JsonLayer {
            out: Mutex::new(Box::new(out)),
            pid: std::process::id(),
        }
    }
}

/// The fields of one span as a JSON fragment (`"name":value,` each), kept in its extensions.
struct SpanFields(String);

/// Appends `s` as a JSON string (quoted, escaped).
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes fields as a JSON fragment: `"name":value,` per field.
struct Collect<'a>(&'a mut String);

impl Collect<'_> {
    fn key(&mut self, field: &Field) {
        let name = match field.name() {
            "message" => "msg",
            n => n,
        };
        push_json_str(self.0, name);
        self.0.push(':');
    }
}

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.key(field);
        push_json_str(self.0, &format!("{value:?}"));
        self.0.push(',');
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.key(field);
        push_json_str(self.0, value);
        self.0.push(',');
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        let _ = write!(self.0, "{value},");
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.0, "{value},");
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.key(field);
        let _ = write!(self.0, "{value},");
    }
}

impl<S> tracing_subscriber::Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = String::new();
        attrs.record(&mut Collect(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &SpanRecord<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<SpanFields>() {
                values.record(&mut Collect(&mut fields.0));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let meta = event.metadata();
        let mut line = String::with_capacity(320);
        let _ = write!(
            line,
            "{{\"t\":{t},\"pid\":{},\"level\":\"{}\",\"target\":",
            self.pid,
            meta.level().as_str()
        );
        push_json_str(&mut line, meta.target());
        line.push(',');
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<SpanFields>() {
                    line.push_str(&fields.0);
                }
            }
        }
        // Event fields last: a reader keeps the last of repeated names.
        event.record(&mut Collect(&mut line));
        line.pop();
        line.push_str("}\n");
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn lines_are_json_with_span_fields_and_escaped_text() {
        let buf = crate::SharedBuf::default();
        let subscriber = tracing_subscriber::registry().with(JsonLayer::new(buf.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let _s = tracing::debug_span!("device", dev = "d0", now = 5u64, qp = 1u32).entered();
            tracing::debug!(
                kind = "x",
                qp = 17u32,
                text = "a\"b\\c\n",
                ok = true,
                n = -3i64,
                "hi"
            );
        });
        let text = String::from_utf8(buf.contents()).unwrap_or_default();
        let r = crate::Record::parse(text.trim_end()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(r.kind, "x");
        assert_eq!(r.text("dev").as_deref(), Some("d0"));
        assert_eq!(r.u64("now"), Some(5));
        assert_eq!(r.u64("qp"), Some(17), "the event's field wins");
        assert_eq!(r.text("text").as_deref(), Some("a\"b\\c\n"));
        assert_eq!(r.bool("ok"), Some(true));
        assert_eq!(r.text("msg").as_deref(), Some("hi"));
        assert_eq!(
            r.fields.get("n").and_then(serde_json::Value::as_i64),
            Some(-3)
        );
    }
}
