//! [`JsonLayer`]: a `tracing` layer that writes each event as one JSON object per line.

use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
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

/// The fields of one span, kept in its extensions.
struct SpanFields(Map<String, Value>);

/// Collects fields into a JSON map.
struct Collect<'a>(&'a mut Map<String, Value>);

impl Collect<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        let name = match field.name() {
            "message" => "msg",
            n => n,
        };
        self.0.insert(name.to_owned(), value);
    }
}

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
}

impl<S> tracing_subscriber::Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut map = Map::new();
        attrs.record(&mut Collect(&mut map));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(map));
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
        let mut map = Map::new();
        map.insert("t".into(), Value::from(t));
        map.insert("pid".into(), Value::from(self.pid));
        map.insert("level".into(), Value::from(meta.level().as_str()));
        map.insert("target".into(), Value::from(meta.target()));
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<SpanFields>() {
                    map.extend(fields.0.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        event.record(&mut Collect(&mut map));
        let mut line = Value::Object(map).to_string();
        line.push('\n');
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
        }
    }
}
