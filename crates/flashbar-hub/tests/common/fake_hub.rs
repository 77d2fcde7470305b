//! A real HTTP server on 127.0.0.1 that speaks the hub's file protocol:
//! `GET /api/models/{owner}/{name}/revision/{rev}` (siblings with sizes and
//! LFS sha256), `HEAD`/`GET /{owner}/{name}/resolve/{rev}/{path}` with the
//! headers hub clients read (x-repo-commit, etag / x-linked-etag,
//! x-linked-size, content-length), Range requests answered with 206, 404s
//! for unknown repos, revisions and files, and an optional redirect of LFS
//! files to another origin (as the hub sends them to its CDN). Faults are
//! switched on per test: ignore Range, cut the connection mid-file, corrupt
//! bytes, slow bodies, and a script of one [`Fault`] per body GET (drops,
//! stalls, error statuses, a wrong Content-Length, a pause the test lifts).

// Each test binary uses a different part of it.
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One file of a fake repo.
#[derive(Clone)]
pub struct FakeFile {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
    pub lfs: bool,
}

impl FakeFile {
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.bytes.as_slice()))
    }

    /// Stands in for the git blob id of a non-LFS file.
    fn blob_id(&self) -> String {
        self.sha256()[..40].to_owned()
    }
}

#[derive(Clone)]
pub struct FakeRepo {
    pub commit: String,
    pub files: Vec<FakeFile>,
}

/// Faults to inject; counters count down per body GET.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub ignore_range: bool,
    /// Drop the connection after this many body bytes ...
    pub cut_after: Option<u64>,
    /// ... for this many GETs.
    pub cuts_left: usize,
    /// Flip a byte in the body of this many GETs of LFS files.
    pub corrupt_left: usize,
    /// Pause between 16 KiB chunks.
    pub chunk_delay: Option<Duration>,
    /// Send LFS bodies from `http://localhost:{port}/cdn/...` (another origin).
    pub redirect_lfs: bool,
    /// Answer this many body GETs with 503 Service Unavailable.
    pub unavailable_left: usize,
    /// One fault per body GET, in order, once the counters above are spent;
    /// an empty script sends bodies whole.
    pub script: std::collections::VecDeque<Fault>,
}

/// What one body GET does wrong (docs/reliability.md, "A flaky hub").
#[derive(Clone, Debug)]
pub enum Fault {
    /// Nothing: the body whole.
    None,
    /// Drop the connection after this many bytes of this answer's body
    /// (counted from the Range start, as are the offsets below).
    Cut(u64),
    /// Answer with this status and an empty body.
    Status(u16),
    /// Send this many bytes, then nothing, without ever ending the body.
    Stall(u64),
    /// Declare a Content-Length this many bytes off what is sent (hyper
    /// then cuts a longer body at the declared length, or drops the
    /// connection where a shorter one ends).
    Length(i64),
    /// Send this many bytes, tell the test, and go on when it says so.
    Gate(u64, Gate),
}

/// A pause inside a body: the server sends `()` on `reached`, then waits
/// until the test calls [`Gate::release`].
#[derive(Clone, Debug)]
pub struct Gate {
    reached: std::sync::mpsc::Sender<()>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    /// The gate, and the receiver that hears when a body reached it.
    pub fn new() -> (Gate, std::sync::mpsc::Receiver<()>) {
        let (reached, heard) = std::sync::mpsc::channel();
        let gate = Gate {
            reached,
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        (gate, heard)
    }

    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

/// What the server saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
    pub status: u16,
}

struct Shared {
    repos: HashMap<String, FakeRepo>,
    faults: Mutex<Faults>,
    seen: Mutex<Vec<Seen>>,
    port: u16,
}

pub struct FakeHub {
    pub url: String,
    shared: Arc<Shared>,
}

impl FakeHub {
    /// Serves `repos` (by `owner/name`) until the runtime ends.
    pub async fn start(repos: HashMap<String, FakeRepo>) -> FakeHub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            repos,
            faults: Mutex::new(Faults::default()),
            seen: Mutex::new(Vec::new()),
            port: addr.port(),
        });
        let app = Router::new()
            .route("/api/models/{owner}/{name}/revision/{rev}", get(listing))
            .route("/{owner}/{name}/resolve/{rev}/{*path}", get(resolve))
            .route("/cdn/{sha}", get(cdn))
            .with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeHub {
            url: format!("http://{addr}"),
            shared,
        }
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults.lock().unwrap() = faults;
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    pub fn clear_seen(&self) {
        self.shared.seen.lock().unwrap().clear();
    }

    /// The Range header of each GET of a file whose path ends with `file`.
    pub fn get_ranges(&self, file: &str) -> Vec<Option<String>> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path.ends_with(file))
            .map(|s| s.range)
            .collect()
    }
}

fn record(shared: &Shared, method: &Method, path: String, headers: &HeaderMap, status: StatusCode) {
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    shared.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path,
        range: text(header::RANGE),
        authorization: text(header::AUTHORIZATION),
        status: status.as_u16(),
    });
}

fn find_repo<'a>(shared: &'a Shared, owner: &str, name: &str, rev: &str) -> Option<&'a FakeRepo> {
    let repo = shared.repos.get(&format!("{owner}/{name}"))?;
    (rev == "main" || rev == repo.commit).then_some(repo)
}

async fn listing(
    State(shared): State<Arc<Shared>>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let path = format!("/api/models/{owner}/{name}/revision/{rev}");
    let Some(repo) = find_repo(&shared, &owner, &name, &rev) else {
        record(&shared, &method, path, &headers, StatusCode::NOT_FOUND);
        return (StatusCode::NOT_FOUND, r#"{"error":"Repository not found"}"#).into_response();
    };
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|f| {
            let mut entry = serde_json::json!({
                "rfilename": f.path,
                "size": f.bytes.len(),
                "blobId": f.blob_id(),
            });
            if f.lfs {
                entry["lfs"] = serde_json::json!({
                    "sha256": f.sha256(),
                    "size": f.bytes.len(),
                    "pointerSize": 134,
                });
            }
            entry
        })
        .collect();
    record(&shared, &method, path, &headers, StatusCode::OK);
    let body = serde_json::json!({ "id": format!("{owner}/{name}"), "sha": repo.commit, "siblings": siblings });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn resolve(
    State(shared): State<Arc<Shared>>,
    Path((owner, name, rev, file)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let path = format!("/{owner}/{name}/resolve/{rev}/{file}");
    let found = find_repo(&shared, &owner, &name, &rev)
        .and_then(|repo| Some((repo, repo.files.iter().find(|f| f.path == file)?)));
    let Some((repo, file)) = found else {
        record(&shared, &method, path, &headers, StatusCode::NOT_FOUND);
        return (StatusCode::NOT_FOUND, "Entry not found").into_response();
    };
    let redirect = file.lfs && shared.faults.lock().unwrap().redirect_lfs;
    let mut meta = vec![(
        header::HeaderName::from_static("x-repo-commit"),
        repo.commit.clone(),
    )];
    if file.lfs {
        meta.push((
            header::HeaderName::from_static("x-linked-etag"),
            format!("\"{}\"", file.sha256()),
        ));
        meta.push((
            header::HeaderName::from_static("x-linked-size"),
            file.bytes.len().to_string(),
        ));
        meta.push((header::ETAG, format!("\"{}\"", file.blob_id())));
    } else {
        meta.push((header::ETAG, format!("\"{}\"", file.blob_id())));
    }
    if redirect {
        record(&shared, &method, path, &headers, StatusCode::FOUND);
        let location = format!("http://localhost:{}/cdn/{}", shared.port, file.sha256());
        let mut response = StatusCode::FOUND.into_response();
        response
            .headers_mut()
            .insert(header::LOCATION, location.parse().unwrap());
        for (name, value) in meta {
            response.headers_mut().insert(name, value.parse().unwrap());
        }
        return response;
    }
    let mut response = body_response(&shared, &method, path, &headers, file);
    for (name, value) in meta {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

async fn cdn(
    State(shared): State<Arc<Shared>>,
    Path(sha): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let path = format!("/cdn/{sha}");
    let file = shared
        .repos
        .values()
        .flat_map(|r| r.files.iter())
        .find(|f| f.lfs && f.sha256() == sha)
        .cloned();
    match file {
        Some(file) => body_response(&shared, &method, path, &headers, &file),
        None => {
            record(&shared, &method, path, &headers, StatusCode::NOT_FOUND);
            StatusCode::NOT_FOUND.into_response()
        }
    }
}

/// The file's bytes (or the asked range), with the active faults applied.
fn body_response(
    shared: &Shared,
    method: &Method,
    path: String,
    headers: &HeaderMap,
    file: &FakeFile,
) -> Response {
    let len = file.bytes.len() as u64;
    let is_get = method == Method::GET;
    let mut faults = shared.faults.lock().unwrap();
    if is_get && faults.unavailable_left > 0 {
        faults.unavailable_left -= 1;
        drop(faults);
        record(
            shared,
            method,
            path,
            headers,
            StatusCode::SERVICE_UNAVAILABLE,
        );
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let start = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|_| !faults.ignore_range);
    let status = match start {
        Some(s) if s >= len => {
            drop(faults);
            record(
                shared,
                method,
                path,
                headers,
                StatusCode::RANGE_NOT_SATISFIABLE,
            );
            return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
        }
        Some(_) => StatusCode::PARTIAL_CONTENT,
        None => StatusCode::OK,
    };
    let start = start.unwrap_or(0);
    let mut body = file.bytes[start as usize..].to_vec();
    let mut cut = None;
    if is_get {
        if faults.corrupt_left > 0 && file.lfs && !body.is_empty() {
            faults.corrupt_left -= 1;
            let middle = body.len() / 2;
            body[middle] ^= 0xff;
        }
        if faults.cuts_left > 0 {
            if let Some(after) = faults.cut_after.filter(|a| *a < len) {
                faults.cuts_left -= 1;
                cut = Some(after.saturating_sub(start) as usize);
            }
        }
    }
    let mut scripted = Fault::None;
    if is_get && cut.is_none() {
        if let Some(fault) = faults.script.pop_front() {
            scripted = fault;
        }
    }
    let delay = faults.chunk_delay;
    drop(faults);
    if let Fault::Status(code) = scripted {
        let code = StatusCode::from_u16(code).unwrap();
        record(shared, method, path, headers, code);
        return code.into_response();
    }
    record(shared, method, path, headers, status);
    let mut declared = body.len() as i64;
    let mut pause = None;
    match scripted {
        Fault::Cut(after) => cut = Some(after as usize),
        Fault::Length(off) => declared += off,
        Fault::Stall(after) => pause = Some((after as usize, None)),
        Fault::Gate(after, gate) => pause = Some((after as usize, Some(gate))),
        Fault::None | Fault::Status(_) => {}
    }
    let body_len = declared.max(0) as usize;
    let stream = async_stream(body, cut, delay, pause);
    let mut response = Response::new(if is_get {
        Body::from_stream(stream)
    } else {
        Body::empty()
    });
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_LENGTH,
        body_len.to_string().parse().unwrap(),
    );
    h.insert(header::ACCEPT_RANGES, "bytes".parse().unwrap());
    if status == StatusCode::PARTIAL_CONTENT {
        let range = format!("bytes {start}-{}/{len}", len - 1);
        h.insert(header::CONTENT_RANGE, range.parse().unwrap());
    }
    response
}

/// The body in 16 KiB chunks; an error after `cut` bytes drops the
/// connection; after `pause.0` bytes the stream waits for the gate, or
/// forever when there is none (a stall).
fn async_stream(
    body: Vec<u8>,
    cut: Option<usize>,
    delay: Option<Duration>,
    pause: Option<(usize, Option<Gate>)>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    struct Sending {
        body: Bytes,
        sent: usize,
        limit: usize,
        cut_happens: bool,
        pause: Option<(usize, Option<Gate>)>,
    }
    let limit = cut.unwrap_or(body.len()).min(body.len());
    let state = Sending {
        cut_happens: cut.is_some_and(|c| c < body.len()),
        body: Bytes::from(body),
        sent: 0,
        limit,
        pause: pause.map(|(after, gate)| (after.min(limit), gate)),
    };
    futures_util::stream::unfold(state, move |mut s| async move {
        if s.pause.as_ref().is_some_and(|(at, _)| *at == s.sent) {
            match s.pause.take().and_then(|(_, gate)| gate) {
                Some(gate) => {
                    let _ = gate.reached.send(());
                    gate.release.acquire().await.unwrap().forget();
                }
                None => std::future::pending::<()>().await,
            }
        }
        if s.sent < s.limit {
            let mut end = (s.sent + 16 * 1024).min(s.limit);
            if let Some((at, _)) = &s.pause {
                if *at > s.sent {
                    end = end.min(*at);
                }
            }
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let chunk = s.body.slice(s.sent..end);
            s.sent = end;
            return Some((Ok(chunk), s));
        }
        if s.cut_happens {
            // Let the bytes so far reach the client before the drop, as on
            // a real network.
            s.cut_happens = false;
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Some((Err(std::io::Error::other("connection cut by the test")), s));
        }
        None
    })
}

/// A fake repo made of a folder's files; `*.safetensors` and tokenizer.json
/// are LFS files, as on the hub.
pub fn repo_from_dir(dir: &std::path::Path, commit: &str) -> FakeRepo {
    let mut files: Vec<FakeFile> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let path = e.file_name().to_string_lossy().into_owned();
            let lfs = path.ends_with(".safetensors") || path == "tokenizer.json";
            FakeFile {
                bytes: Arc::new(std::fs::read(e.path()).unwrap()),
                path,
                lfs,
            }
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    FakeRepo {
        commit: commit.to_owned(),
        files,
    }
}

/// A repo at `commit` of a small config and `weights` bytes of seeded
/// pseudo-random weights (xorshift, the same bytes every run).
pub fn small_repo(commit: &str, weights: usize) -> FakeRepo {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let weights: Vec<u8> = (0..weights)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let file = |path: &str, bytes: Vec<u8>, lfs| FakeFile {
        path: path.into(),
        bytes: Arc::new(bytes),
        lfs,
    };
    FakeRepo {
        commit: commit.into(),
        files: vec![
            file(
                "config.json",
                br#"{"model_type": "qwen3_5"}"#.to_vec(),
                false,
            ),
            file("model.safetensors", weights, true),
        ],
    }
}
