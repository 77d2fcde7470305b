//! The running endpoint: [`Server::start`] binds and serves in the
//! background over an already loaded model ([`Worker`], shared by `Arc`, so
//! restarting the server never reloads it), within [`Limits`];
//! [`Server::stop`] shuts down gracefully (in-flight answers get a grace
//! period, then are cut, which cancels their generations).

use crate::limits::Limits;
use crate::routes::{self, AppState, ObserveRequests};
use crate::{cors, listen, DEFAULT_PORT};
use flashbar_engine::worker::Worker;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// How the endpoint is served.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Where to listen (default 127.0.0.1:[`DEFAULT_PORT`]; port 0 picks a
    /// free one).
    pub addr: SocketAddr,
    /// When set, `/v1` requests must present this key.
    pub api_key: Option<String>,
    /// Origins allowed by CORS; empty = CORS off.
    pub cors_origins: Vec<String>,
    /// How long [`Server::stop`] lets in-flight answers finish.
    pub shutdown_grace: Duration,
    /// Sizes and timeouts each client must keep to.
    pub limits: Limits,
    /// Sees every request's tokens and rounds (the desktop app's metrics).
    pub observe: Option<ObserveRequests>,
    /// Gets every request's log line as well as the log (the app's Server panel).
    pub request_log: Option<crate::request_log::LineSink>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT),
            api_key: None,
            cors_origins: Vec::new(),
            shutdown_grace: Duration::from_secs(5),
            limits: Limits::default(),
            observe: None,
            request_log: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("port {} on {} is already in use (is another server running? choose another port with --port)", .0.port(), .0.ip())]
    PortBusy(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid CORS origin {0:?}")]
    CorsOrigin(String),
}

/// A running endpoint.
pub struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    cut: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    grace: Duration,
}

impl Server {
    /// Binds `options.addr` and serves `worker`'s model, named `model_id`,
    /// on the current tokio runtime.
    pub async fn start(
        worker: Arc<Worker>,
        model_id: impl Into<String>,
        options: ServerOptions,
    ) -> Result<Server, ServerError> {
        let (state, cut) = AppState::observed(
            worker,
            model_id.into(),
            options.limits.clone(),
            options.observe.clone(),
            options.request_log.clone(),
        );
        let mut app = routes::router(state, options.api_key.as_deref().map(Arc::from));
        if !options.cors_origins.is_empty() {
            app = app.layer(cors::layer(&options.cors_origins).map_err(ServerError::CorsOrigin)?);
        }
        let listener = tokio::net::TcpListener::bind(options.addr)
            .await
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::AddrInUse => ServerError::PortBusy(options.addr),
                _ => ServerError::Bind {
                    addr: options.addr,
                    source,
                },
            })?;
        let addr = listener.local_addr().unwrap_or(options.addr);
        let (shutdown, signal) = oneshot::channel::<()>();
        let limits = options.limits.clone();
        let task = tokio::spawn(listen::serve(listener, app, limits, async move {
            let _ = signal.await;
        }));
        Ok(Server {
            addr,
            shutdown: Some(shutdown),
            cut,
            task: Some(task),
            grace: options.shutdown_grace,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets in-flight answers finish within the grace
    /// period, then cuts the rest (cancelling their generations).
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(self.grace, &mut task).await.is_err() {
                // Cut the answers still running (their generations are
                // cancelled), then give their connections a moment to close.
                let _ = self.cut.send(true);
                if tokio::time::timeout(Duration::from_secs(1), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
        }
    }

    /// Waits until the server ends (it only ends through [`Server::stop`]
    /// or a fatal error).
    pub async fn wait(&mut self) {
        if let Some(task) = self.task.as_mut() {
            let _ = task.await;
            self.task = None;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.cut.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashbar_engine::worker::echo::echo_worker;

    #[tokio::test]
    async fn start_stop_restart_and_busy_port() {
        let worker = Arc::new(echo_worker(4, 0));
        let options = ServerOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServerOptions::default()
        };
        let first = Server::start(worker.clone(), "echo", options.clone())
            .await
            .unwrap();
        let taken = ServerOptions {
            addr: first.local_addr(),
            ..options.clone()
        };
        let busy = Server::start(worker.clone(), "echo", taken.clone())
            .await
            .err()
            .unwrap();
        assert!(matches!(busy, ServerError::PortBusy(_)));
        assert!(busy.to_string().contains("already in use"));
        first.stop().await;
        // Same worker (no reload), same port, again.
        let again = Server::start(worker, "echo", taken).await.unwrap();
        again.stop().await;
    }

    #[tokio::test]
    async fn stop_cuts_running_streams_after_the_grace_period() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let worker = Arc::new(echo_worker(4, 5));
        let options = ServerOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            shutdown_grace: Duration::from_millis(100),
            ..ServerOptions::default()
        };
        let server = Server::start(worker.clone(), "echo", options)
            .await
            .unwrap();
        let mut socket = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        let body = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":60,"stream":true}"#;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut buffer = [0u8; 512];
        assert!(socket.read(&mut buffer).await.unwrap() > 0);
        assert!(worker.busy());
        let started = std::time::Instant::now();
        server.stop().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        // The generation was cancelled well before its 60 x 5 ms.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!worker.busy());
    }

    #[tokio::test]
    async fn each_request_is_seen_by_an_observer_from_the_options() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        /// Counts the tokens it sees.
        struct Count(Arc<AtomicUsize>);
        impl flashbar_engine::Sink for Count {
            fn commit(&mut self, commit: &flashbar_engine::Commit) -> bool {
                self.0
                    .fetch_add(usize::from(commit.token.is_some()), Ordering::SeqCst);
                true
            }
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let options = ServerOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            observe: Some(ObserveRequests(Arc::new(move || {
                Box::new(Count(counter.clone())) as flashbar_engine::Observer
            }))),
            ..ServerOptions::default()
        };
        let server = Server::start(Arc::new(echo_worker(4, 0)), "echo", options)
            .await
            .unwrap();
        for _ in 0..2 {
            let mut socket = tokio::net::TcpStream::connect(server.local_addr())
                .await
                .unwrap();
            let body = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":3}"#;
            let request = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            socket.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        assert_eq!(seen.load(Ordering::SeqCst), 6, "3 tokens per request");
        server.stop().await;
    }
}
