//! The chat and text completion request bodies, parsed and converted into
//! engine requests as the server does: any bytes give a checked request or
//! an OpenAI error object with a 4xx status, never a panic; a checked
//! request always holds values the engine accepts.
#![no_main]

use flashbar_engine::{GenerateRequest, Prompt};
use flashbar_server::api::{ChatRequest, CompletionRequest};
use flashbar_server::convert::{self, ModelNames, Parsed};
use flashbar_server::ApiError;
use libfuzzer_sys::fuzz_target;

const CONTEXT: usize = 4096;

fn names() -> ModelNames {
    ModelNames {
        id: "target".into(),
    }
}

fn check(result: Result<Parsed, ApiError>) {
    match result {
        Ok(parsed) => {
            let request: &GenerateRequest = &parsed.request;
            assert!((1..=CONTEXT).contains(&request.max_tokens));
            request.sampling.validate().unwrap();
            assert!(request.stop.iter().all(|s| !s.is_empty()));
            assert_ne!(request.block_size, Some(0));
            assert_eq!(parsed.model, "target");
            if let Prompt::Messages(messages) = &request.prompt {
                assert!(!messages.is_empty());
            }
        }
        Err(error) => {
            assert!(error.status.is_client_error(), "{error:?}");
            let body = error.body();
            assert!(body["error"]["message"].is_string());
            assert!(body["error"]["type"].is_string());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(
        convert::parse_json::<ChatRequest>(data)
            .and_then(|body| convert::chat(body, &names(), CONTEXT)),
    );
    check(
        convert::parse_json::<CompletionRequest>(data)
            .and_then(|body| convert::completion(body, &names(), CONTEXT)),
    );
});
