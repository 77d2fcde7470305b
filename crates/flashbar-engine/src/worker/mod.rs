//! The generation worker: ONE thread owns the engine (MLX arrays stay on
//! it) and takes jobs from a bounded FIFO queue, so requests are served
//! fairly in arrival order; a full queue is refused at once
//! ([`EngineError::QueueFull`]). Each job streams [`Event`]s back over a
//! channel (async for the server's handlers, blocking for the app). The
//! app's chat, the HTTP server and their tests all queue here.
//!
//! Idle unload ([`Worker::spawn_unloading`]): after a stretch with no job
//! the thread drops the model and MLX's buffer cache, and the next job
//! loads it again before it runs (its `Started` event says how long that
//! took). Unloading and reloading happen on the engine thread between jobs,
//! so a request that arrives meanwhile simply waits in the queue.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::request::{CancelToken, GenerateRequest};
use crate::sink::{Begin, Commit, Generation, NullSink, RoundStats, Sink, Tee};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Requests that may wait for the engine by default.
pub const DEFAULT_QUEUE_CAPACITY: usize = 64;

/// What the worker needs from a model: the engine, or a test's stand-in
/// (`echo`). `generate` checks the request before its sink's `begin`.
pub trait Backend {
    fn context_length(&self) -> usize;
    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError>;
}

impl Backend for Engine {
    fn context_length(&self) -> usize {
        Engine::context_length(self)
    }
    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError> {
        Engine::generate(self, request, sink)
    }
}

/// What a job reports, in order: `Started` (or `Failed`), `Reasoning`* and
/// `Text`* as they come, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The request passed the engine's checks and generation began.
    Started {
        prompt_tokens: usize,
        /// The model had been unloaded while idle and was loaded again
        /// for this request, taking this long.
        reloaded_ms: Option<u64>,
    },
    /// Reasoning released (a thinking model's `<think>` block).
    Reasoning(String),
    /// Answer text released.
    Text(String),
    Done(Box<Generation>),
    Failed(EngineError),
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
    /// The model is in memory (false once unloaded while idle).
    pub loaded: bool,
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
    loaded: AtomicBool,
    /// Milliseconds without a job before the model is unloaded; 0: never.
    idle_unload_ms: AtomicU64,
}

impl State {
    fn set_idle_unload(&self, idle_unload: Option<Duration>) {
        let ms = idle_unload.map_or(0, |d| (d.as_millis() as u64).max(1));
        self.idle_unload_ms.store(ms, Ordering::SeqCst);
    }

    fn idle_unload(&self) -> Option<Duration> {
        match self.idle_unload_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// The engine thread's model: loaded at start, dropped after an idle
/// stretch, loaded again by the next job.
struct Resident<B, F> {
    backend: Option<B>,
    load: F,
}

impl<B, E: Display, F: FnMut() -> Result<B, E>> Resident<B, F> {
    /// The model, loading it first if it was unloaded (with the time that took).
    fn get(&mut self, state: &State) -> Result<(&B, Option<u64>), EngineError> {
        let mut reloaded_ms = None;
        if self.backend.is_none() {
            let started = Instant::now();
            let backend = (self.load)().map_err(|e| EngineError::Reload(e.to_string()))?;
            let ms = started.elapsed().as_millis() as u64;
            tracing::info!(ms, "model reloaded after an idle unload");
            self.backend = Some(backend);
            state.loaded.store(true, Ordering::SeqCst);
            reloaded_ms = Some(ms);
        }
        match &self.backend {
            Some(backend) => Ok((backend, reloaded_ms)),
            None => Err(EngineError::Reload("the model is not loaded".into())),
        }
    }

    /// Drops the model and the buffers MLX keeps for reuse.
    fn release(&mut self, state: &State) {
        if let Some(backend) = self.backend.take() {
            drop(backend);
            if let Err(error) = mlx_rs::memory::clear_cache() {
                tracing::info!("clearing MLX's cache after an idle unload: {error}");
            }
            give_back_freed_heap();
            // Unloaded once the memory is given back, not before.
            state.loaded.store(false, Ordering::SeqCst);
            tracing::info!("model unloaded after an idle stretch");
        }
    }
}

/// glibc keeps freed heap pages in its arenas (one per thread that
/// allocated) for reuse; after an unload they would stay resident for the
/// hours the app sits idle. `malloc_trim` hands them back to the system
/// (docs/reliability.md, "Idle unload"). Other allocators (macOS's) return
/// large freed regions on their own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn give_back_freed_heap() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's malloc_trim takes a byte count and only releases
    // free memory; it is safe to call from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_back_freed_heap() {}

/// glibc serves an allocation from 128 KiB up with its own mapping, which a
/// free returns at once, but after such a free it raises that threshold
/// (up to 32 MiB), so the next load's weight buffers (the CPU's host
/// kernels keep them on the Rust heap) land in its arenas, where freed
/// pages can stay resident even after `malloc_trim`: each reload kept a few
/// MB more (docs/reliability.md, "Idle unload"). Setting the threshold
/// fixes it where it starts.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn map_large_allocations() {
    extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: mallopt only changes glibc's allocation policy for later
    // allocations; it is safe to call from any thread.
    ONCE.call_once(|| unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn map_large_allocations() {}

/// The next job; None once the queue is closed. While the model is loaded
/// and an idle unload is set, waits at most that long, then releases it.
fn next_job<B, E: Display, F: FnMut() -> Result<B, E>>(
    queue: &Receiver<Job>,
    state: &State,
    resident: &mut Resident<B, F>,
) -> Option<Job> {
    loop {
        let idle = state.idle_unload().filter(|_| resident.backend.is_some());
        let Some(idle) = idle else {
            return queue.recv().ok();
        };
        match queue.recv_timeout(idle) {
            Ok(job) => return Some(job),
            Err(RecvTimeoutError::Timeout) => resident.release(state),
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Only the first load of [`Worker::spawn`]'s one-shot loader exists: that
/// worker never unloads, so never loads again.
enum Once<E> {
    First(E),
    Again,
}

impl<E> Display for Once<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Once::First(_) => "the model could not be loaded",
            Once::Again => "this worker loads its model once",
        })
    }
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
    /// never crosses threads); returns once loading finished. The model
    /// stays loaded for the worker's life.
    pub fn spawn<B, E, F>(capacity: usize, load: F) -> Result<Worker, E>
    where
        B: Backend + 'static,
        E: Send + 'static,
        F: FnOnce() -> Result<B, E> + Send + 'static,
    {
        let mut load = Some(load);
        let once = move || match load.take() {
            Some(load) => load().map_err(Once::First),
            None => Err(Once::Again),
        };
        Self::spawn_unloading(capacity, None, once).map_err(|error| match error {
            Once::First(error) => error,
            // The first call of `once` is its only one.
            Once::Again => unreachable!("the first load is the first call"),
        })
    }

    /// [`Worker::spawn`] with idle unload: after `idle_unload` without a job
    /// (None: never; [`Worker::set_idle_unload`] changes it later) the model
    /// is dropped, and `load` runs again for the next job.
    pub fn spawn_unloading<B, E, F>(
        capacity: usize,
        idle_unload: Option<Duration>,
        mut load: F,
    ) -> Result<Worker, E>
    where
        B: Backend + 'static,
        E: Display + Send + 'static,
        F: FnMut() -> Result<B, E> + Send + 'static,
    {
        map_large_allocations();
        let (jobs, queue) = sync_channel::<Job>(capacity.max(1));
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel::<Result<usize, E>>();
        let state = Arc::new(State::default());
        // Before the thread starts: its first wait for a job already needs it.
        state.set_idle_unload(idle_unload);
        let thread_state = state.clone();
        let thread = std::thread::Builder::new()
            .name("flashbar-engine".into())
            .spawn(move || {
                let backend = match load() {
                    Ok(backend) => {
                        thread_state.loaded.store(true, Ordering::SeqCst);
                        let _ = loaded_tx.send(Ok(backend.context_length()));
                        backend
                    }
                    Err(error) => {
                        let _ = loaded_tx.send(Err(error));
                        return;
                    }
                };
                let mut resident = Resident {
                    backend: Some(backend),
                    load,
                };
                while let Some(job) = next_job(&queue, &thread_state, &mut resident) {
                    // Busy first, then out of the queue: a job in hand is
                    // never counted in neither (see `Activity`).
                    thread_state.busy.store(true, Ordering::SeqCst);
                    thread_state.queued.fetch_sub(1, Ordering::SeqCst);
                    if !(job.cancel.is_cancelled() || job.events.is_closed()) {
                        // Else its client left while it waited.
                        match resident.get(&thread_state) {
                            Ok((backend, reloaded_ms)) => run(backend, job, reloaded_ms),
                            Err(error) => {
                                let _ = job.events.send(Event::Failed(error));
                            }
                        }
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

    /// Changes how long the model may sit idle before it is unloaded
    /// (None: never); takes effect from the next wait for a job (a thread
    /// already waiting without a timeout keeps waiting until a job comes).
    pub fn set_idle_unload(&self, idle_unload: Option<Duration>) {
        self.state.set_idle_unload(idle_unload);
    }

    /// Queues a generation; its events come on the returned channel.
    /// Refused at once when the queue is full.
    pub fn submit(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
    ) -> Result<UnboundedReceiver<Event>, EngineError> {
        self.submit_observed(request, cancel, None)
    }

    /// [`Worker::submit`], with an observer that also receives every
    /// token, text delta and round of the generation.
    pub fn submit_observed(
        &self,
        request: GenerateRequest,
        cancel: CancelToken,
        observer: Option<Observer>,
    ) -> Result<UnboundedReceiver<Event>, EngineError> {
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(EngineError::Stopped);
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
            Err(_) => {
                return Err(EngineError::QueueFull {
                    capacity: self.capacity,
                })
            }
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
                    TrySendError::Full(_) => EngineError::QueueFull {
                        capacity: self.capacity,
                    },
                    TrySendError::Disconnected(_) => EngineError::Stopped,
                })
            }
        }
    }

    /// Queued and busy, read so that an idle answer means no job is waiting
    /// or in hand (the queue first: see `Activity`).
    pub fn activity(&self) -> Activity {
        let queued = self.state.queued.load(Ordering::SeqCst);
        let busy = self.state.busy.load(Ordering::SeqCst);
        let loaded = self.state.loaded.load(Ordering::SeqCst);
        Activity {
            queued,
            busy,
            loaded,
        }
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

/// Forwards a job's start and text to its channel; a cancel or a closed
/// channel (client gone) stops the generation.
struct ChannelSink<'a> {
    events: &'a UnboundedSender<Event>,
    cancel: &'a CancelToken,
    reloaded_ms: Option<u64>,
}

impl ChannelSink<'_> {
    fn go_on(&self) -> bool {
        !(self.cancel.is_cancelled() || self.events.is_closed())
    }
}

impl Sink for ChannelSink<'_> {
    fn begin(&mut self, begin: &Begin) -> bool {
        let started = Event::Started {
            prompt_tokens: begin.prompt_tokens,
            reloaded_ms: self.reloaded_ms,
        };
        self.events.send(started).is_ok() && self.go_on()
    }

    fn commit(&mut self, commit: &Commit) -> bool {
        if !commit.reasoning.is_empty()
            && self
                .events
                .send(Event::Reasoning(commit.reasoning.into()))
                .is_err()
        {
            return false;
        }
        if !commit.text.is_empty() && self.events.send(Event::Text(commit.text.into())).is_err() {
            return false;
        }
        self.go_on()
    }

    fn round(&mut self, _stats: &RoundStats) -> bool {
        self.go_on()
    }
}

/// Runs one job on the engine thread: the engine checks the request (an
/// error then comes before anything is streamed, so the server can still
/// answer with its status), then streams it.
fn run(backend: &dyn Backend, mut job: Job, reloaded_ms: Option<u64>) {
    let mut observer = job.observer.take();
    let events = &job.events;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let channel = ChannelSink {
            events,
            cancel: &job.cancel,
            reloaded_ms,
        };
        let mut null = NullSink;
        let observer: &mut dyn Sink = match observer.as_mut() {
            Some(observer) => observer,
            None => &mut null,
        };
        backend.generate(&job.request, &mut Tee(channel, observer))
    }));
    let event = match outcome {
        Ok(Ok(generation)) => Event::Done(Box::new(generation)),
        Ok(Err(error)) => Event::Failed(error),
        Err(_) => Event::Failed(EngineError::Panicked),
    };
    let _ = events.send(event);
}

#[cfg(any(test, feature = "echo"))]
pub mod echo;
#[cfg(test)]
mod tests;
