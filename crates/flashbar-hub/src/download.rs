//! Fetches one file into the store's blob folder, resumably and checked.
//!
//! hf-hub 0.5 downloads in Range chunks but never checks that the answer is
//! a 206 for the asked range (a server that ignores Range would have the
//! whole file written at each chunk's offset), checks no sha256, and has no
//! cancel; so the body goes through reqwest here, the way the Python client
//! does it: `<blob>.incomplete` grows until it is complete, is resumed with
//! `Range: bytes=N-`, restarted from zero on a 200, hashed, and only then
//! renamed to its blob name.

use crate::error::{from_reqwest, HubError};
use crate::files::RemoteFile;
use crate::progress::{PullEvent, Tracker};
use crate::remote::is_transient_status;
use crate::store::partial_path;
use crate::CancelToken;
use futures_util::StreamExt;
use reqwest::header::{CONTENT_RANGE, RANGE};
use reqwest::{Client, StatusCode};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One attempt at one file.
pub(crate) struct Fetch<'a> {
    pub client: &'a Client,
    pub url: &'a str,
    pub file: &'a RemoteFile,
    pub blob: &'a Path,
    pub cancel: &'a CancelToken,
    pub stall_timeout: Duration,
}

impl Fetch<'_> {
    /// Downloads what is missing, verifies, and moves the file into place.
    pub async fn run(&self, tracker: &mut Tracker<'_>) -> Result<(), HubError> {
        let partial = partial_path(self.blob);
        let name = self.file.path.as_str();
        let size = self.file.size;
        let mut have = match tokio::fs::metadata(&partial).await {
            Ok(meta) => meta.len(),
            Err(_) => 0,
        };
        if have > size {
            // Longer than the file can be: not ours to trust.
            tracker.rewind(size.min(have));
            truncate(&partial).await?;
            have = 0;
        }
        let mut hasher = Sha256::new();
        if have > 0 {
            hash_prefix(&partial, have, &mut hasher).await?;
        }
        tracker.emit(PullEvent::FileStarted {
            file: name.to_owned(),
            size,
            resumed_from: have,
        });
        if have < size {
            have = self.receive(&partial, have, &mut hasher, tracker).await?;
        }
        if have != size {
            return Err(HubError::transient(
                name,
                format!("the connection ended at {have} of {size} bytes"),
            ));
        }
        let actual = hex::encode(hasher.finalize());
        if let Some(expected) = &self.file.sha256 {
            if &actual != expected {
                // Corrupted on the way: never keep it, never resume from it.
                let _ = tokio::fs::remove_file(&partial).await;
                tracker.rewind(size);
                return Err(HubError::Corrupt {
                    file: name.to_owned(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        tokio::fs::rename(&partial, self.blob)
            .await
            .map_err(HubError::io(self.blob))?;
        tracker.emit(PullEvent::FileDone {
            file: name.to_owned(),
            size,
            sha256_checked: self.file.sha256.is_some(),
        });
        Ok(())
    }

    /// Appends the body to `partial` from byte `have`; returns the new length.
    async fn receive(
        &self,
        partial: &Path,
        mut have: u64,
        hasher: &mut Sha256,
        tracker: &mut Tracker<'_>,
    ) -> Result<u64, HubError> {
        let name = self.file.path.as_str();
        let size = self.file.size;
        let mut request = self.client.get(self.url);
        if have > 0 {
            request = request.header(RANGE, format!("bytes={have}-"));
        }
        let response = tokio::select! {
            _ = self.cancel.cancelled() => return Err(HubError::Cancelled),
            sent = tokio::time::timeout(self.stall_timeout, request.send()) => match sent {
                Err(_) => return Err(HubError::transient(name, "no answer from the server")),
                Ok(result) => result.map_err(|e| from_reqwest(name, e))?,
            },
        };
        let status = response.status();
        match status {
            StatusCode::PARTIAL_CONTENT if have > 0 => {
                let start = response
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(range_start);
                if start != Some(have) {
                    // Not the bytes we asked for: start over rather than splice.
                    tracker.rewind(have);
                    truncate(partial).await?;
                    *hasher = Sha256::new();
                    return Err(HubError::transient(
                        name,
                        format!("the server sent range {start:?} for bytes={have}-"),
                    ));
                }
            }
            StatusCode::OK => {
                if have > 0 {
                    // The server ignored Range and sends the whole file.
                    tracker.rewind(have);
                    truncate(partial).await?;
                    *hasher = Sha256::new();
                    have = 0;
                }
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                tracker.rewind(have);
                truncate(partial).await?;
                return Err(HubError::transient(
                    name,
                    "the server refused the resume range",
                ));
            }
            StatusCode::NOT_FOUND => {
                return Err(HubError::protocol(name, "the file vanished (HTTP 404)"))
            }
            s if is_transient_status(s) => {
                return Err(HubError::transient(name, format!("HTTP {s}")))
            }
            s => return Err(HubError::protocol(name, format!("HTTP {s}"))),
        }
        if let Some(parent) = partial.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(HubError::io(parent))?;
        }
        let mut out = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(partial)
            .await
            .map_err(HubError::io(partial))?;
        let mut body = response.bytes_stream();
        let outcome = loop {
            let next = tokio::select! {
                _ = self.cancel.cancelled() => break Err(HubError::Cancelled),
                next = tokio::time::timeout(self.stall_timeout, body.next()) => next,
            };
            let chunk = match next {
                Err(_) => break Err(HubError::transient(name, "the download stalled")),
                Ok(None) => break Ok(()),
                Ok(Some(Err(e))) => break Err(from_reqwest(name, e)),
                Ok(Some(Ok(chunk))) => chunk,
            };
            if have + chunk.len() as u64 > size {
                break Err(HubError::SizeMismatch {
                    file: name.to_owned(),
                    detail: format!("the server sent more than the {size} bytes the hub lists"),
                });
            }
            if let Err(e) = out.write_all(&chunk).await {
                break Err(HubError::io(partial)(e));
            }
            hasher.update(&chunk);
            have += chunk.len() as u64;
            tracker.advance(chunk.len() as u64, name, have, size);
        };
        // What arrived stays on disk, so a retry or a later pull resumes it.
        out.flush().await.map_err(HubError::io(partial))?;
        out.sync_all().await.map_err(HubError::io(partial))?;
        if let Err(HubError::SizeMismatch { .. }) = &outcome {
            tracker.rewind(have);
            truncate(partial).await?;
        }
        outcome.map(|()| have)
    }
}

/// The first byte of a `Content-Range: bytes a-b/n` answer.
fn range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

async fn truncate(path: &Path) -> Result<(), HubError> {
    match tokio::fs::OpenOptions::new().write(true).open(path).await {
        Ok(file) => file.set_len(0).await.map_err(HubError::io(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HubError::io(path)(e)),
    }
}

/// Feeds the first `len` bytes already on disk to the hasher.
async fn hash_prefix(path: &Path, len: u64, hasher: &mut Sha256) -> Result<(), HubError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(HubError::io(path))?;
    let mut reader = tokio::io::BufReader::new(file).take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).await.map_err(HubError::io(path))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_range_start() {
        assert_eq!(range_start("bytes 100-199/200"), Some(100));
        assert_eq!(range_start("bytes */200"), None);
        assert_eq!(range_start("items 1-2/3"), None);
    }
}
