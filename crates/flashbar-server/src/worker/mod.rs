//! The generation worker: ONE thread owns the engine (MLX arrays stay on
//! it) and takes jobs from a bounded FIFO queue, so requests are served
//! fairly in arrival order; a full queue is refused at once (429). Each job
//! streams [`Event`]s back to its async handler over a channel.

use crate::api::Outcome;
use crate::error::ApiError;
use flashbar_engine::{
    CancelToken, Engine, EngineError, GenerateRequest, Generation, Mode, Prompt, RoundStats, Sink,
    Speculation,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Requests that may wait for the engine by default.
pub const DEFAULT_QUEUE_CAPACITY: usize = 64;

/// What the worker needs from a model: the engine, or a test's stand-in.
pub trait Backend {
    fn context_length(&self) -> usize;
    fn has_drafter(&self) -> bool;
    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError>;
    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation, EngineError>;
}

impl Backend for Engine {
    fn context_length(&self) -> usize {
        Engine::context_length(self)
    }
    fn has_drafter(&self) -> bool {
        self.drafter().is_some()
    }
    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        Engine::prompt_ids(self, prompt)
    }
    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
        cancel: &CancelToken,
    ) -> Result<Generation, EngineError> {
        Engine::generate(self, request, sink, cancel)
    }
}

/// What a job reports, in order: `Started` (or `Failed`), `Text`*, then
/// `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The request passed the engine's checks and generation began.
    Started {
        prompt_tokens: usize,
    },
    Text(String),
    Done(Box<Outcome>),
    Failed(ApiError),
}

/// Sees a job's tokens (with their origin), text and rounds as they happen,
/// on the engine thread: the desktop app's chat and metrics panel.
pub type Observer = Box<dyn Sink + Send>;

struct Job {
    request: GenerateRequest,
    cancel: CancelToken,
    events: UnboundedSender<Event>,
    observer: Option<Observer>,
}

/// What the worker is doing, as `/health` reports it. Read through
/// [`Worker::activity`]: `queued == 0 && !busy` only once no job is waiting
/// or in hand (the engine thread marks itself busy before it counts a job
/// out of the queue, and the snapshot reads the queue first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    pub queued: usize,
    pub busy: bool,
}

impl Activity {
    pub fn idle(&self) -> bool {
        self.queued == 0 && !self.busy
    }
}

#[derive(Default)]
struct State {
    busy: AtomicBool,
    /// Jobs submitted and not yet taken by the engine thread; never above
    /// the capacity (a slot is reserved before the job is sent).
    queued: AtomicUsize,
    /// The most `queued` has been since the worker started.
    queued_peak: AtomicUsize,
}

/// Handle to the worker thread; cheap to share (`Arc`). Dropping the last
/// handle ends the thread and waits for it, so the model is freed before
/// the process exits (MLX must not tear down under a live thread).
pub struct Worker {
    jobs: Option<SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    state: Arc<State>,
    capacity: usize,
    context_length: usize,
}

/// Cancels its generation when dropped: the handler or stream holding it
/// went away (client disconnect) or finished.
pub struct CancelOnDrop(pub CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl Worker {
    /// Starts the worker thread and loads the model ON it (so the model
    /// never crosses threads); returns once loading finished.
    pub fn spawn<B, E, F>(capacity: usize, load: F) -> Result<Worker, E>
    where
        B: Backend + 'static,
        E: Send + 'static,
        F: FnOnce() -> Result<B, E> + Send + 'static,
    {
        let (jobs, queue) = sync_channel::<Job>(capacity.max(1));
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel::<Result<usize, E>>();
        let state = Arc::new(State::default());
        let thread_state = state.clone();
        let thread = std::thread::Builder::new()
            .name("flashbar-engine".into())
            .spawn(move || {
                let backend = match load() {
                    Ok(backend) => {
                        let _ = loaded_tx.send(Ok(backend.context_length()));
                        backend
                    }
                    Err(error) => {
                        let _ = loaded_tx.send(Err(error));
                        return;
                    }
                };
                while let Ok(job) = queue.recv() {
                    // Busy first, then out of the queue: a job in hand is
                    // never counted in neither (see `Activity`).
                    thread_state.busy.store(true, Ordering::SeqCst);
                    thread_state.queued.fetch_sub(1, Ordering::SeqCst);
                    if !(job.cancel.is_cancelled() || job.events.is_closed()) {
                        run(&backend, job); // else its client left while it waited
                    }
                    thread_state.busy.store(false, Ordering::SeqCst);
                }
            })
            .expect("spawning the engine thread");
        let context_length = match loaded_rx.recv() {
            Ok(Ok(context)) => context,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(_) => panic!("the engine thread died while loading"),
        };
        Ok(Worker {
            jobs: Some(jobs),
            thread: Some(thread),
            state,
            capacity,
            context_length,
        })
    }

    /// Queues a generation; its events come on the returned channel.
    /// Refused with 429 when the queue is full.
    pub fn submit(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
    ) -> Result<UnboundedReceiver<Event>, ApiError> {
        self.submit_observed(request, cancel, None)
    }

    /// [`Worker::submit`], with an observer that also receives every
    /// token, text delta and round of the generation.
    pub fn submit_observed(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
        observer: Option<Observer>,
    ) -> Result<UnboundedReceiver<Event>, ApiError> {
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(ApiError::internal("the engine has stopped"));
        };
        let (events, receiver) = unbounded_channel();
        // A slot is reserved before the job is sent, and refused when none
        // is left, so `queued` (what /health reports) never exceeds the
        // capacity, even for a moment; the channel never holds more jobs
        // than `queued` counts (the engine thread takes a job, then
        // uncounts it), so the send below cannot find it full.
        let bound = self.capacity.max(1);
        let reserved =
            self.state
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
                    (queued < bound).then_some(queued + 1)
                });
        let queued = match reserved {
            Ok(before) => before + 1,
            Err(_) => return Err(ApiError::queue_full(self.capacity)),
        };
        self.state.queued_peak.fetch_max(queued, Ordering::SeqCst);
        match jobs.try_send(Job {
            request,
            cancel,
            events,
            observer,
        }) {
            Ok(()) => Ok(receiver),
            Err(error) => {
                self.state.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match error {
                    TrySendError::Full(_) => ApiError::queue_full(self.capacity),
                    TrySendError::Disconnected(_) => ApiError::internal("the engine has stopped"),
                })
            }
        }
    }

    /// Queued and busy, read so that an idle answer means no job is waiting
    /// or in hand (the queue first: see `Activity`).
    pub fn activity(&self) -> Activity {
        let queued = self.state.queued.load(Ordering::SeqCst);
        let busy = self.state.busy.load(Ordering::SeqCst);
        Activity { queued, busy }
    }

    /// Whether a generation is running now.
    pub fn busy(&self) -> bool {
        self.state.busy.load(Ordering::SeqCst)
    }

    /// Requests waiting for the engine.
    pub fn queued(&self) -> usize {
        self.state.queued.load(Ordering::SeqCst)
    }

    /// The most requests that have waited at once since the worker started.
    pub fn queued_peak(&self) -> usize {
        self.state.queued_peak.load(Ordering::SeqCst)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Longest prompt + completion the model takes.
    pub fn context_length(&self) -> usize {
        self.context_length
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its current job is done.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Forwards text to the job's channel and counts rejected drafts; a closed
/// channel (client gone) cancels the generation.
struct ChannelSink<'a> {
    events: &'a UnboundedSender<Event>,
    cancel: &'a CancelToken,
    rejected: usize,
    observer: Option<&'a mut Observer>,
}

impl Sink for ChannelSink<'_> {
    fn text(&mut self, delta: &str) {
        if let Some(observer) = self.observer.as_mut() {
            observer.text(delta);
        }
        if self.events.send(Event::Text(delta.to_owned())).is_err() {
            self.cancel.cancel();
        }
    }

    fn token(&mut self, id: u32, from_draft: bool) {
        if let Some(observer) = self.observer.as_mut() {
            observer.token(id, from_draft);
        }
    }

    fn round(&mut self, stats: &RoundStats) {
        if let Some(observer) = self.observer.as_mut() {
            observer.round(stats);
        }
        if stats.mode == Mode::Dflash {
            self.rejected += stats.block_size.saturating_sub(1 + stats.accepted);
        }
    }
}

fn run(backend: &dyn Backend, mut job: Job) {
    let mut observer = job.observer.take();
    let events = &job.events;
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<Outcome, ApiError> {
        // The engine's own checks, made before anything is streamed so a
        // bad request is still answered with its HTTP status.
        if job.request.speculation == Speculation::Dflash && !backend.has_drafter() {
            return Err(ApiError::invalid_param(
                "speculation",
                "speculation \"dflash\" needs a drafter, and none is loaded",
            ));
        }
        let prompt = backend.prompt_ids(&job.request.prompt)?;
        let context = backend.context_length();
        if prompt.is_empty() {
            return Err(ApiError::invalid_param("messages", "the prompt is empty"));
        }
        if prompt.len() >= context {
            return Err(ApiError::invalid_param(
                "messages",
                format!(
                    "the prompt has {} tokens; the model's context is {context}",
                    prompt.len()
                ),
            ));
        }
        let _ = events.send(Event::Started {
            prompt_tokens: prompt.len(),
        });
        let mut sink = ChannelSink {
            events,
            cancel: &job.cancel,
            rejected: 0,
            observer: observer.as_mut(),
        };
        let generation = backend.generate(&job.request, &mut sink, &job.cancel)?;
        Ok(Outcome {
            generation,
            rejected_tokens: sink.rejected,
        })
    }));
    let event = match outcome {
        Ok(Ok(outcome)) => Event::Done(Box::new(outcome)),
        Ok(Err(error)) => Event::Failed(error),
        Err(_) => Event::Failed(ApiError::internal("the engine panicked on this request")),
    };
    let _ = events.send(event);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flashbar_engine::{FinishReason, Totals};

    /// Echoes the prompt's words, one token per word, slowly when asked.
    pub struct EchoBackend {
        pub delay: std::time::Duration,
    }

    impl Backend for EchoBackend {
        fn context_length(&self) -> usize {
            64
        }
        fn has_drafter(&self) -> bool {
            false
        }
        fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
            Ok(match prompt {
                Prompt::Text(text) => text.split_whitespace().map(|_| 1).collect(),
                Prompt::Messages(m) => m.iter().map(|_| 1).collect(),
            })
        }
        fn generate(
            &self,
            request: &GenerateRequest,
            sink: &mut dyn Sink,
            cancel: &CancelToken,
        ) -> Result<Generation, EngineError> {
            let mut text = String::new();
            let mut finish = FinishReason::Length;
            for i in 0..request.max_tokens {
                if cancel.is_cancelled() {
                    finish = FinishReason::Cancelled;
                    break;
                }
                std::thread::sleep(self.delay);
                let word = format!("w{i} ");
                sink.token(i as u32, i % 2 == 1);
                sink.text(&word);
                text.push_str(&word);
            }
            Ok(Generation {
                text,
                token_ids: Vec::new(),
                finish_reason: finish,
                stats: Totals {
                    prompt_tokens: 1,
                    completion_tokens: request.max_tokens,
                    ..Totals::default()
                },
            })
        }
    }

    pub fn echo_worker(capacity: usize, delay_ms: u64) -> Worker {
        Worker::spawn(capacity, move || {
            Ok::<_, ()>(EchoBackend {
                delay: std::time::Duration::from_millis(delay_ms),
            })
        })
        .unwrap()
    }

    fn request(max_tokens: usize) -> GenerateRequest {
        let mut r = GenerateRequest::new(Prompt::Text("a b".into()));
        r.max_tokens = max_tokens;
        r
    }

    #[test]
    fn a_job_streams_then_finishes() {
        let worker = echo_worker(4, 0);
        let mut rx = worker.submit(request(3), CancelToken::default()).unwrap();
        assert!(matches!(
            rx.blocking_recv(),
            Some(Event::Started { prompt_tokens: 2 })
        ));
        let mut text = String::new();
        loop {
            match rx.blocking_recv().unwrap() {
                Event::Text(t) => text.push_str(&t),
                Event::Done(outcome) => {
                    assert_eq!(outcome.generation.text, text);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(text, "w0 w1 w2 ");
    }

    /// Records what an observer is shown.
    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl Sink for Recorder {
        fn text(&mut self, delta: &str) {
            self.0.lock().unwrap().push(format!("text {delta}"));
        }
        fn token(&mut self, id: u32, from_draft: bool) {
            self.0
                .lock()
                .unwrap()
                .push(format!("token {id} {from_draft}"));
        }
    }

    #[test]
    fn an_observer_sees_tokens_with_their_origin_and_text() {
        let worker = echo_worker(4, 0);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let observer: Observer = Box::new(Recorder(seen.clone()));
        let mut rx = worker
            .submit_observed(request(2), CancelToken::default(), Some(observer))
            .unwrap();
        while let Some(event) = rx.blocking_recv() {
            if matches!(event, Event::Done(_) | Event::Failed(_)) {
                break;
            }
        }
        assert_eq!(
            *seen.lock().unwrap(),
            ["token 0 false", "text w0 ", "token 1 true", "text w1 "]
        );
    }

    #[test]
    fn the_queue_never_counts_past_its_capacity_under_concurrent_submits() {
        let worker = std::sync::Arc::new(echo_worker(4, 20));
        let cancel = CancelToken::default();
        // Runs for far longer than the submits below take, on any machine.
        let _running = worker.submit(request(1_000_000), cancel.clone()).unwrap();
        while worker.queued() > 0 {
            std::thread::yield_now();
        }
        let threads: Vec<_> = (0..32)
            .map(|_| {
                let worker = worker.clone();
                std::thread::spawn(move || {
                    let outcome = worker.submit(request(1), CancelToken::default());
                    assert!(worker.queued() <= 4);
                    outcome.map_err(|e| e.status.as_u16())
                })
            })
            .collect();
        let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let accepted = outcomes.iter().filter(|o| o.is_ok()).count();
        let refused = outcomes.iter().filter(|o| matches!(o, Err(429))).count();
        assert_eq!((accepted, refused), (4, 28));
        assert_eq!(worker.queued_peak(), 4);
        cancel.cancel();
    }

    #[test]
    fn activity_counts_a_job_in_hand_as_busy_until_it_ends() {
        let worker = echo_worker(4, 20);
        let cancel = CancelToken::default();
        let _running = worker.submit(request(1_000_000), cancel.clone()).unwrap();
        while worker.queued() > 0 {
            std::thread::yield_now();
        }
        assert_eq!(
            worker.activity(),
            Activity {
                queued: 0,
                busy: true
            }
        );
        let waiting = CancelToken::default();
        let _waiting = worker.submit(request(1), waiting.clone()).unwrap();
        assert_eq!(
            worker.activity(),
            Activity {
                queued: 1,
                busy: true
            }
        );
        waiting.cancel();
        cancel.cancel();
        while !worker.activity().idle() {
            std::thread::yield_now();
        }
        assert_eq!(
            worker.activity(),
            Activity {
                queued: 0,
                busy: false
            }
        );
    }

    #[test]
    fn a_full_queue_is_refused_with_429() {
        let worker = echo_worker(1, 20);
        let cancel = CancelToken::default();
        let _running = worker.submit(request(50), cancel.clone()).unwrap();
        // Wait until the worker took the first job, then fill the queue.
        while worker.queued() > 0 {
            std::thread::yield_now();
        }
        let _waiting = worker.submit(request(1), CancelToken::default()).unwrap();
        let refused = worker
            .submit(request(1), CancelToken::default())
            .unwrap_err();
        assert_eq!(refused.status.as_u16(), 429);
        cancel.cancel();
    }

    #[test]
    fn dflash_without_a_drafter_fails_before_starting() {
        let worker = echo_worker(1, 0);
        let mut r = request(1);
        r.speculation = Speculation::Dflash;
        let mut rx = worker.submit(r, CancelToken::default()).unwrap();
        match rx.blocking_recv() {
            Some(Event::Failed(e)) => assert_eq!(e.param.as_deref(), Some("speculation")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn too_long_prompts_are_invalid() {
        let worker = echo_worker(1, 0);
        let words = vec!["x"; 64].join(" ");
        let mut r = request(1);
        r.prompt = Prompt::Text(words);
        let mut rx = worker.submit(r, CancelToken::default()).unwrap();
        match rx.blocking_recv() {
            Some(Event::Failed(e)) => assert_eq!(e.status.as_u16(), 400),
            other => panic!("{other:?}"),
        }
    }
}
