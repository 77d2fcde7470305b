//! The worker's queue, cancellation and idle unload, on stand-in backends.
use super::echo::{echo_worker, EchoBackend};
use super::*;
use crate::request::{Prompt, Speculation};
use crate::sink::Commit;

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
        Some(Event::Started {
            prompt_tokens: 2,
            reloaded_ms: None
        })
    ));
    let mut text = String::new();
    loop {
        match rx.blocking_recv().unwrap() {
            Event::Text(t) => text.push_str(&t),
            Event::Done(outcome) => {
                assert_eq!(outcome.text, text);
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
    fn commit(&mut self, commit: &Commit) -> bool {
        self.0.lock().unwrap().push(format!(
            "token {:?} {} text {}",
            commit.token, commit.from_draft, commit.text
        ));
        true
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
        [
            "token Some(0) false text w0 ",
            "token Some(1) true text w1 "
        ]
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
                outcome.map_err(|e| matches!(e, EngineError::QueueFull { capacity: 4 }))
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let accepted = outcomes.iter().filter(|o| o.is_ok()).count();
    let refused = outcomes.iter().filter(|o| matches!(o, Err(true))).count();
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
            busy: true,
            loaded: true,
        }
    );
    let waiting = CancelToken::default();
    let _waiting = worker.submit(request(1), waiting.clone()).unwrap();
    assert_eq!(
        worker.activity(),
        Activity {
            queued: 1,
            busy: true,
            loaded: true,
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
            busy: false,
            loaded: true,
        }
    );
}

#[test]
fn a_full_queue_is_refused_at_once() {
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
    assert!(
        matches!(refused, EngineError::QueueFull { capacity: 1 }),
        "{refused:?}"
    );
    cancel.cancel();
}

#[test]
fn dflash_without_a_drafter_fails_before_starting() {
    let worker = echo_worker(1, 0);
    let mut r = request(1);
    r.speculation = Speculation::Dflash;
    let mut rx = worker.submit(r, CancelToken::default()).unwrap();
    match rx.blocking_recv() {
        Some(Event::Failed(EngineError::InvalidParam { param, .. })) => {
            assert_eq!(param, "speculation")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_prompt_the_backend_refuses_fails_before_anything_streams() {
    let worker = echo_worker(1, 0);
    let words = vec!["x"; 64].join(" ");
    let mut r = request(1);
    r.prompt = Prompt::Text(words);
    let mut rx = worker.submit(r, CancelToken::default()).unwrap();
    match rx.blocking_recv() {
        Some(Event::Failed(EngineError::InvalidParam { param, .. })) => assert_eq!(param, "prompt"),
        other => panic!("{other:?}"),
    }
}

/// An echo backend that counts its loads and can hold its unload (its
/// drop) until the test lets it finish.
struct Counted {
    echo: EchoBackend,
    unloading: Option<std::sync::mpsc::SyncSender<()>>,
    finish: Option<Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>>,
}

impl Backend for Counted {
    fn context_length(&self) -> usize {
        self.echo.context_length()
    }
    fn generate(
        &self,
        request: &GenerateRequest,
        sink: &mut dyn Sink,
    ) -> Result<Generation, EngineError> {
        self.echo.generate(request, sink)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let (Some(unloading), Some(finish)) = (&self.unloading, &self.finish) {
            let _ = unloading.send(());
            let _ = finish.lock().unwrap().recv();
        }
    }
}

fn counting_worker(
    idle: Option<Duration>,
    loads: Arc<AtomicUsize>,
    hold: Option<(
        std::sync::mpsc::SyncSender<()>,
        std::sync::mpsc::Receiver<()>,
    )>,
) -> Worker {
    let (unloading, finish) = match hold {
        Some((tx, rx)) => (Some(tx), Some(Arc::new(std::sync::Mutex::new(rx)))),
        None => (None, None),
    };
    Worker::spawn_unloading(4, idle, move || {
        loads.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(Counted {
            echo: EchoBackend {
                delay: Duration::ZERO,
            },
            unloading: unloading.clone(),
            finish: finish.clone(),
        })
    })
    .unwrap()
}

/// Runs one job to its end: (its reload time, its text).
fn answer(worker: &Worker) -> (Option<u64>, String) {
    let mut events = worker.submit(request(3), CancelToken::default()).unwrap();
    let mut reloaded = None;
    let mut text = String::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Started { reloaded_ms, .. } => reloaded = reloaded_ms,
            Event::Text(delta) => text.push_str(&delta),
            Event::Reasoning(r) => panic!("the echo stand-in has no reasoning: {r:?}"),
            Event::Done(outcome) => {
                assert_eq!(outcome.text, text);
                return (reloaded, text);
            }
            Event::Failed(error) => panic!("{error}"),
        }
    }
    panic!("the job ended without Done");
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn an_idle_model_is_unloaded_and_the_next_job_loads_it_again() {
    let loads = Arc::new(AtomicUsize::new(0));
    let worker = counting_worker(Some(Duration::from_millis(30)), loads.clone(), None);
    assert_eq!(answer(&worker), (None, "w0 w1 w2 ".into()));
    wait_until("unloaded", || !worker.activity().loaded);
    assert_eq!(loads.load(Ordering::SeqCst), 1, "unloading loads nothing");
    let (reloaded, text) = answer(&worker);
    assert!(
        reloaded.is_some(),
        "the job after an unload reports its reload"
    );
    assert_eq!(text, "w0 w1 w2 ");
    assert_eq!(loads.load(Ordering::SeqCst), 2);
}

#[test]
fn a_job_arriving_during_the_unload_waits_for_it_then_answers() {
    let loads = Arc::new(AtomicUsize::new(0));
    let (unloading_tx, unloading) = std::sync::mpsc::sync_channel(1);
    let (finish, finish_rx) = std::sync::mpsc::sync_channel(1);
    let worker = counting_worker(
        Some(Duration::from_millis(10)),
        loads.clone(),
        Some((unloading_tx, finish_rx)),
    );
    // The unload has begun and is held halfway (the model's drop).
    unloading.recv().unwrap();
    let mut events = worker.submit(request(3), CancelToken::default()).unwrap();
    assert_eq!(worker.activity().queued, 1, "the job waits in the queue");
    finish.send(()).unwrap();
    let mut text = String::new();
    let mut reloaded = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Started { reloaded_ms, .. } => reloaded = reloaded_ms,
            Event::Text(delta) => text.push_str(&delta),
            Event::Reasoning(r) => panic!("the echo stand-in has no reasoning: {r:?}"),
            Event::Done(_) => break,
            Event::Failed(error) => panic!("{error}"),
        }
    }
    assert_eq!(text, "w0 w1 w2 ");
    assert!(reloaded.is_some());
    assert_eq!(loads.load(Ordering::SeqCst), 2);
    // Let the worker's later unloads and its drop finish too.
    drop(finish);
}

#[test]
fn without_a_timeout_the_model_stays_and_a_timeout_set_later_applies() {
    let loads = Arc::new(AtomicUsize::new(0));
    let worker = counting_worker(None, loads.clone(), None);
    assert_eq!(answer(&worker).0, None);
    std::thread::sleep(Duration::from_millis(50));
    assert!(worker.activity().loaded, "no timeout: never unloaded");
    worker.set_idle_unload(Some(Duration::from_millis(20)));
    // The new timeout counts from the next wait, after a job.
    assert_eq!(answer(&worker).0, None);
    wait_until("unloaded", || !worker.activity().loaded);
    assert!(answer(&worker).0.is_some());
    assert_eq!(loads.load(Ordering::SeqCst), 2);
}

#[test]
fn reasoning_and_answer_come_as_their_own_events() {
    use super::echo::scripted_worker;
    let reply = "Think hard.\n</think>\n\nThe answer.";
    let worker = scripted_worker(vec![(String::new(), reply.into())], 3);
    let mut r = GenerateRequest::new(Prompt::Messages(vec![crate::Message::new("user", "q")]));
    r.template
        .kwargs
        .insert("enable_thinking".into(), serde_json::Value::Bool(true));
    let mut events = worker.submit(r, CancelToken::default()).unwrap();
    let (mut reasoning, mut text) = (String::new(), String::new());
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Started { .. } => {}
            Event::Reasoning(delta) => reasoning.push_str(&delta),
            Event::Text(delta) => text.push_str(&delta),
            Event::Done(outcome) => {
                assert_eq!(
                    (outcome.reasoning.as_str(), outcome.text.as_str()),
                    (reasoning.as_str(), text.as_str())
                );
                // "Thi", "nk ", "har", "d.\n", "</t", "hin", "k>\n": 7 pieces touch the block.
                assert_eq!(outcome.stats.reasoning_tokens, 7);
                break;
            }
            Event::Failed(error) => panic!("{error}"),
        }
    }
    assert_eq!(
        (reasoning.as_str(), text.as_str()),
        ("Think hard.", "The answer.")
    );
}
