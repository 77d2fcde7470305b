//! What one client may cost the server: body and header sizes, how long it
//! may take to send them (slow clients are cut off), and how many
//! connections may be open at once.

use std::time::Duration;

/// Limits on each connection and request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body (413 past it). Long prompts fit: a full
    /// 131k-token context is well under 1 MB of text.
    pub max_body_bytes: usize,
    /// Largest request head, start line and headers together (431 past it).
    pub max_header_bytes: usize,
    /// Most headers in one request (431 past it).
    pub max_headers: usize,
    /// Time a client has to send a whole request head; a connection idle
    /// or dribbling headers longer than this is closed.
    pub header_timeout: Duration,
    /// Time a client has to send a whole request body (408 past it).
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_header_bytes: 32 << 10,
            max_headers: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
        }
    }
}
