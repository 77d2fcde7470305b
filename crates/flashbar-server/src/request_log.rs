//! The server log: one line per HTTP request, written when its response
//! ends (a whole answer sent, a stream finished, a client gone), so a
//! streamed answer's line holds its tokens and its whole time.
//!
//! The line names the method, the path, the model, the status, the prompt
//! and completion tokens, the speculation mode asked for and the one used,
//! the accepted drafts and the time. It never holds a header (so never an
//! API key), a query string or any prompt or completion text.
//! `docs/logging.md` says where the lines go.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use flashbar_engine::Generation;
use flashbar_engine::{Mode, Speculation};
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

/// The tracing target of the request lines (filter on it to keep only them).
pub const TARGET: &str = "flashbar::server::request";

/// A path longer than this is cut (a 404 may carry anything).
const PATH_LIMIT: usize = 120;

/// Also gets every request line (the desktop app's Server panel).
#[derive(Clone)]
pub struct LineSink(pub Arc<dyn Fn(&RequestLine) + Send + Sync>);

impl fmt::Debug for LineSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LineSink")
    }
}

/// What a handler learns about its request, shared with the line.
#[derive(Clone, Default)]
pub struct Record(Arc<Mutex<Learned>>);

#[derive(Default)]
struct Learned {
    model: Option<String>,
    asked: Option<Speculation>,
    usage: Option<Usage>,
}

#[derive(Clone, Copy)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    mode: Option<Mode>,
    accepted: usize,
}

impl Record {
    fn with(&self, change: impl FnOnce(&mut Learned)) {
        if let Ok(mut learned) = self.0.lock() {
            change(&mut learned);
        }
    }

    /// The request was parsed: the model it named and the mode it asked for.
    pub fn parsed(&self, model: &str, asked: Speculation) {
        self.with(|l| {
            l.model = Some(model.to_owned());
            l.asked = Some(asked);
        });
    }

    /// The generation ended.
    pub fn done(&self, generation: &Generation) {
        let s = &generation.stats;
        let usage = Usage {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            mode: s.mode,
            accepted: s.accepted_tokens,
        };
        self.with(|l| l.usage = Some(usage));
    }
}

/// One request, as logged.
#[derive(Clone, Debug, PartialEq, serde::Serialize, ts_rs::TS)]
pub struct RequestLine {
    pub method: String,
    pub path: String,
    pub model: Option<String>,
    pub status: u16,
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    /// The speculation mode the request asked for.
    pub speculation: Option<Speculation>,
    /// How its tokens were made, if it generated.
    pub mode: Option<Mode>,
    pub accepted_drafts: Option<usize>,
    #[ts(type = "number")]
    pub ms: u64,
}

impl fmt::Display for RequestLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn or_dash<T: fmt::Display>(value: &Option<T>) -> String {
            value.as_ref().map_or("-".to_owned(), ToString::to_string)
        }
        write!(
            f,
            "{} {} {} model={} prompt_tokens={} completion_tokens={} speculation={} mode={} accepted={} {} ms",
            self.method,
            self.path,
            self.status,
            or_dash(&self.model),
            or_dash(&self.prompt_tokens),
            or_dash(&self.completion_tokens),
            or_dash(&self.speculation.map(Speculation::name)),
            or_dash(&self.mode.map(Mode::name)),
            or_dash(&self.accepted_drafts),
            self.ms
        )
    }
}

/// The path as logged: printable ASCII only, cut at PATH_LIMIT.
fn clean_path(path: &str) -> String {
    let mut clean: String = path
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .take(PATH_LIMIT)
        .collect();
    if path.chars().count() > PATH_LIMIT {
        clean.push('…');
    }
    clean
}

/// The line is written when this is dropped: when the response body ends
/// or is abandoned.
struct Pending {
    method: String,
    path: String,
    status: u16,
    record: Record,
    started: Instant,
    sink: Option<LineSink>,
}

impl Pending {
    fn line(&self) -> RequestLine {
        let learned = self.record.0.lock().ok();
        let learned = learned.as_deref();
        let usage = learned.and_then(|l| l.usage);
        RequestLine {
            method: self.method.clone(),
            path: self.path.clone(),
            model: learned.and_then(|l| l.model.clone()),
            status: self.status,
            prompt_tokens: usage.map(|u| u.prompt_tokens),
            completion_tokens: usage.map(|u| u.completion_tokens),
            speculation: learned.and_then(|l| l.asked),
            mode: usage.and_then(|u| u.mode),
            accepted_drafts: usage.map(|u| u.accepted),
            ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let line = self.line();
        tracing::info!(target: TARGET, "{line}");
        if let Some(sink) = &self.sink {
            (sink.0)(&line);
        }
    }
}

/// A response body that writes its request's line when it ends.
struct Logged {
    inner: Body,
    pending: Option<Pending>,
}

impl HttpBody for Logged {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.pending.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware: gives the handlers a [`Record`] and logs the request
/// when its response ends.
pub async fn log_requests(
    State(sink): State<Option<LineSink>>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let path = clean_path(request.uri().path());
    let record = Record::default();
    request.extensions_mut().insert(record.clone());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let pending = Pending {
        method,
        path,
        status,
        record,
        started,
        sink,
    };
    Response::from_parts(
        parts,
        Body::new(Logged {
            inner: body,
            pending: Some(pending),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_what_was_asked_and_made() {
        let line = RequestLine {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            model: Some("flashbar-default".into()),
            status: 200,
            prompt_tokens: Some(12),
            completion_tokens: Some(40),
            speculation: Some(Speculation::Auto),
            mode: Some(Mode::Dflash),
            accepted_drafts: Some(31),
            ms: 812,
        };
        assert_eq!(
            line.to_string(),
            "POST /v1/chat/completions 200 model=flashbar-default prompt_tokens=12 \
             completion_tokens=40 speculation=auto mode=dflash accepted=31 812 ms"
        );
    }

    #[test]
    fn paths_are_printable_and_short() {
        assert_eq!(clean_path("/v1/models/a\nb"), "/v1/models/a?b");
        let long = format!("/{}", "x".repeat(500));
        let cut = clean_path(&long);
        assert_eq!(cut.chars().count(), PATH_LIMIT + 1);
        assert!(cut.ends_with('…'));
    }
}
