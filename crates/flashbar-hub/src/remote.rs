//! What the hub says about a repo revision: its commit and files (the API's
//! `siblings`, with `?blobs=true` for sizes and LFS sha256), and per file the
//! resolve endpoint's headers (`x-repo-commit`, `x-linked-etag` / `etag`,
//! `x-linked-size` / `content-length`).

use crate::config::HubConfig;
use crate::error::{from_reqwest, HubError};
use crate::files::{RemoteFile, RemoteRepo};
use hf_hub::api::tokio::{Api, ApiBuilder, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, ETAG, USER_AGENT};
use reqwest::{redirect, Client, StatusCode};
use serde::Deserialize;

/// The HTTP side of one pull: hf-hub's API handle (endpoint, auth, user
/// agent, URL scheme) and a client for metadata probes.
pub(crate) struct Remote {
    api: Api,
    /// hf-hub's own metadata probe sends `Range: bytes=0-0` and requires a
    /// `Content-Range` answer, so a server that ignores Range breaks it; this
    /// client sends HEAD and stops at cross-origin redirects, where the hub
    /// puts the `x-linked-*` headers, as the Python client does.
    probe: Client,
    endpoint: String,
    timeout: std::time::Duration,
}

impl Remote {
    pub fn new(config: &HubConfig) -> Result<Self, HubError> {
        let token = config.effective_token().map(str::to_owned);
        let api = ApiBuilder::from_cache(Cache::new(config.store.root().to_owned()))
            .with_endpoint(config.endpoint.clone())
            .with_token(token.clone())
            .with_progress(false)
            .with_user_agent("flashbar", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| HubError::Invalid(format!("cannot set up the hub client: {e}")))?;
        let mut headers = HeaderMap::new();
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("flashbar/", env!("CARGO_PKG_VERSION"))),
        );
        if let Some(token) = token {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                HubError::Invalid("the token has characters a header cannot carry".into())
            })?;
            headers.insert(AUTHORIZATION, value);
        }
        let probe = Client::builder()
            .default_headers(headers)
            .redirect(redirect::Policy::custom(|attempt| {
                let same_origin = attempt
                    .previous()
                    .last()
                    .is_some_and(|last| last.origin() == attempt.url().origin());
                if attempt.previous().len() > 10 {
                    attempt.error("too many redirects")
                } else if same_origin {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .connect_timeout(config.stall_timeout)
            .timeout(config.stall_timeout)
            .build()
            .map_err(|e| HubError::Invalid(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Remote {
            api,
            probe,
            endpoint: config.endpoint.clone(),
            timeout: config.stall_timeout,
        })
    }

    /// The client that fetches file bodies (follows redirects to a CDN;
    /// reqwest drops the Authorization header when the host changes).
    pub fn client(&self) -> &Client {
        self.api.client()
    }

    fn repo(&self, repo: &str, revision: &str) -> ApiRepo {
        self.api.repo(Repo::with_revision(
            repo.to_owned(),
            RepoType::Model,
            revision.to_owned(),
        ))
    }

    /// The resolve URL of a file at a commit.
    pub fn file_url(&self, repo: &str, commit: &str, file: &str) -> String {
        self.repo(repo, commit).url(file)
    }

    /// The commit a revision points at, and its files for which `keep` holds
    /// (only those are probed).
    pub async fn list(
        &self,
        repo: &str,
        revision: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<RemoteRepo, HubError> {
        let context = format!("listing {repo}@{revision}");
        let request = self
            .repo(repo, revision)
            .info_request()
            .query(&[("blobs", "true")])
            .timeout(self.timeout);
        let response = request
            .send()
            .await
            .map_err(|e| from_reqwest(&context, e))?;
        self.check_status(response.status(), repo, revision, &context)?;
        let info: ApiInfo = response
            .json()
            .await
            .map_err(|e| HubError::protocol(&context, format!("unreadable answer: {e}")))?;
        let files = info
            .siblings
            .into_iter()
            .filter(|s| keep(&s.rfilename))
            .map(|s| {
                let sha256 = s.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase());
                let size = s.lfs.as_ref().map(|l| l.size).or(s.size);
                ListedFile {
                    path: s.rfilename,
                    size,
                    etag: sha256.clone().or(s.blob_id),
                    sha256,
                }
            })
            .collect::<Vec<_>>();
        let commit = info.sha;
        if !is_commit_hash(&commit) {
            return Err(HubError::protocol(
                &context,
                format!("bad commit id {commit:?}"),
            ));
        }
        let mut described = Vec::with_capacity(files.len());
        for file in files {
            described.push(self.describe(repo, &commit, file).await?);
        }
        Ok(RemoteRepo {
            commit,
            files: described,
        })
    }

    /// Completes a listed file with the resolve endpoint's headers, and
    /// checks that both sources agree.
    async fn describe(
        &self,
        repo: &str,
        commit: &str,
        listed: ListedFile,
    ) -> Result<RemoteFile, HubError> {
        let context = format!("{repo}/{}", listed.path);
        if !is_safe_repo_path(&listed.path) {
            return Err(HubError::protocol(
                &context,
                "a file path that leaves the repo",
            ));
        }
        let url = self.file_url(repo, commit, &listed.path);
        let response = self
            .probe
            .head(&url)
            .send()
            .await
            .map_err(|e| from_reqwest(&context, e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Err(HubError::FileNotFound {
                repo: repo.to_owned(),
                file: listed.path,
            });
        }
        // A redirect to the CDN carries the metadata itself.
        if !status.is_redirection() {
            self.check_status(status, repo, commit, &context)?;
        }
        let headers = response.headers();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        };
        if let Some(served) = header("x-repo-commit") {
            if served != commit {
                return Err(HubError::protocol(
                    &context,
                    format!("served commit {served}, expected {commit}"),
                ));
            }
        }
        let etag = header("x-linked-etag")
            .or_else(|| header(ETAG.as_str()))
            .map(|e| clean_etag(&e));
        let size = header("x-linked-size")
            .or_else(|| header(CONTENT_LENGTH.as_str()))
            .and_then(|s| s.parse::<u64>().ok());
        let size = match (listed.size, size) {
            (Some(a), Some(b)) if a != b => {
                return Err(HubError::protocol(
                    &context,
                    format!("the listing says {a} bytes, the file endpoint {b}"),
                ))
            }
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => return Err(HubError::protocol(&context, "no size given")),
        };
        let sha256 = listed
            .sha256
            .or_else(|| etag.clone().filter(|e| is_sha256(e)));
        if let (Some(sha), Some(etag)) = (&sha256, &etag) {
            if is_sha256(etag) && etag != sha {
                return Err(HubError::protocol(
                    &context,
                    format!("the listing says sha256 {sha}, the file endpoint {etag}"),
                ));
            }
        }
        let etag = sha256
            .clone()
            .or(etag)
            .or(listed.etag)
            .ok_or_else(|| HubError::protocol(&context, "no etag given"))?;
        if etag.is_empty() || etag.contains(['/', '\\', '.']) {
            return Err(HubError::protocol(
                &context,
                format!("unusable etag {etag:?}"),
            ));
        }
        Ok(RemoteFile {
            path: listed.path,
            size,
            sha256,
            etag,
        })
    }

    fn check_status(
        &self,
        status: StatusCode,
        repo: &str,
        revision: &str,
        context: &str,
    ) -> Result<(), HubError> {
        match status {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(HubError::RepoNotFound {
                repo: repo.to_owned(),
                revision: revision.to_owned(),
                endpoint: self.endpoint.clone(),
            }),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(HubError::AccessDenied {
                repo: repo.to_owned(),
                endpoint: self.endpoint.clone(),
                status: status.as_u16(),
            }),
            s if is_transient_status(s) => Err(HubError::transient(context, format!("HTTP {s}"))),
            s => Err(HubError::protocol(context, format!("HTTP {s}"))),
        }
    }
}

/// Server trouble that may pass: 408, 429 and 5xx.
pub(crate) fn is_transient_status(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

/// A relative path of plain components: nothing a server could use to write
/// outside the snapshot folder.
pub(crate) fn is_safe_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

fn clean_etag(raw: &str) -> String {
    raw.trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase()
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_commit_hash(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

struct ListedFile {
    path: String,
    size: Option<u64>,
    sha256: Option<String>,
    etag: Option<String>,
}

#[derive(Deserialize)]
struct ApiInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: String,
    size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_paths_stay_inside() {
        assert!(is_safe_repo_path("config.json"));
        assert!(is_safe_repo_path("sub/dir/model.safetensors"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a\\b",
            "./a",
        ] {
            assert!(!is_safe_repo_path(bad), "{bad}");
        }
    }

    #[test]
    fn etags_are_cleaned() {
        assert_eq!(clean_etag("W/\"AbC\""), "abc");
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256("abc"));
    }
}
