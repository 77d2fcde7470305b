//! Where to download from, with which credentials, into which store, and how
//! hard to try: read from the environment the way the Python hub client
//! reads it (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`, `HF_HUB_CACHE`).

use crate::store::{env_nonempty, hf_home, Store};

use std::time::Duration;

/// The official hub; any other endpoint is a mirror.
pub const OFFICIAL_ENDPOINT: &str = "https://huggingface.co";

/// How a pull talks to the hub.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// Base URL of the hub or mirror, without a trailing slash.
    pub endpoint: String,
    /// The user's token, if any (`HF_TOKEN`, else the token file beside the cache).
    pub token: Option<String>,
    /// Send the token to a mirror too. Off by default: a mirror is a third
    /// party, and the token grants access to the user's account.
    pub send_token_to_mirror: bool,
    /// Where downloads go (an HF cache folder).
    pub store: Store,
    /// Attempts after the first for one file, and the backoff between them.
    pub retry: RetryPolicy,
    /// Pretend this many bytes are free on the store's disk (tests; a user
    /// who wants to cap what a pull may use).
    pub assume_free_bytes: Option<u64>,
    /// Give up on a connection that sends nothing for this long.
    pub stall_timeout: Duration,
}

/// Exponential backoff: `base * 2^attempt`, capped at `max`.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl HubConfig {
    /// The defaults, overridden by the environment.
    pub fn from_env() -> Self {
        let endpoint = env_nonempty("HF_ENDPOINT").unwrap_or_else(|| OFFICIAL_ENDPOINT.to_owned());
        let token = env_nonempty("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(hf_home().join("token"))
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        HubConfig {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token,
            send_token_to_mirror: false,
            store: Store::from_env(),
            retry: RetryPolicy::default(),
            assume_free_bytes: None,
            stall_timeout: Duration::from_secs(60),
        }
    }

    /// Same, with another endpoint (`--endpoint`).
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = endpoint.trim_end_matches('/').to_owned();
        self
    }

    /// Same, with another store root (`--dir`).
    pub fn with_store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// Whether the endpoint is the official hub (by host, over https).
    pub fn is_official_endpoint(&self) -> bool {
        match reqwest::Url::parse(&self.endpoint) {
            Ok(url) => {
                url.scheme() == "https"
                    && matches!(url.host_str(), Some("huggingface.co" | "hf.co"))
            }
            Err(_) => false,
        }
    }

    /// The token to send to this endpoint: never to a mirror unless asked.
    pub fn effective_token(&self) -> Option<&str> {
        if self.is_official_endpoint() || self.send_token_to_mirror {
            self.token.as_deref()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(endpoint: &str, to_mirror: bool) -> HubConfig {
        HubConfig {
            token: Some("hf_x".into()),
            send_token_to_mirror: to_mirror,
            ..HubConfig::from_env().with_endpoint(endpoint)
        }
    }

    #[test]
    fn the_token_goes_to_the_official_hub_only_unless_asked() {
        assert_eq!(
            with("https://huggingface.co/", false).effective_token(),
            Some("hf_x")
        );
        assert_eq!(with("https://hf.co", false).effective_token(), Some("hf_x"));
        for mirror in [
            "https://hf-mirror.com",
            "http://huggingface.co",
            "https://huggingface.co.evil.example",
            "not a url",
        ] {
            assert_eq!(with(mirror, false).effective_token(), None, "{mirror}");
        }
        assert_eq!(
            with("https://hf-mirror.com", true).effective_token(),
            Some("hf_x")
        );
    }
}
