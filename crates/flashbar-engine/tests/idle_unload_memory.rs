//! Idle unload with the real engine on the embedded pair: once the worker
//! has unloaded the model, MLX's memory (arrays in use plus its buffer
//! cache) is back within 5% of what it was before the model was loaded,
//! and the next request loads the pair again and gives the same answer.
//! Its own test binary: MLX's memory counters are per process.

use flashbar_engine::{CancelToken, Engine, Event, GenerateRequest, Prompt, Speculation, Worker};
use mlx_rs::memory::{active_memory, cache_memory};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn mlx_bytes() -> usize {
    active_memory().unwrap() + cache_memory().unwrap()
}

fn answer(worker: &Worker) -> (String, Option<u64>) {
    let mut request = GenerateRequest::new(Prompt::Text("def fib(n):".into()));
    request.max_tokens = 12;
    request.speculation = Speculation::Dflash;
    let mut events = worker.submit(request, CancelToken::default()).unwrap();
    let mut reloaded = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            Event::Started { reloaded_ms, .. } => reloaded = reloaded_ms,
            Event::Text(_) => {}
            Event::Done(generation) => return (generation.text.clone(), reloaded),
            Event::Failed(error) => panic!("{error}"),
        }
    }
    panic!("no answer");
}

#[test]
fn an_unloaded_model_gives_back_its_memory_and_reloads_on_the_next_request() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    // MLX's own one-time state (the CPU device, its streams) is not the model's.
    mlx_rs::ops::zeros::<f32>(&[1]).unwrap().eval().unwrap();
    let floor = mlx_bytes();
    let worker = Worker::spawn_unloading(4, Some(Duration::from_millis(300)), move || {
        Engine::load(&root.join("target"), Some(&root.join("drafter")))
    })
    .unwrap();
    let loaded = mlx_bytes();
    assert!(
        loaded > floor + (1 << 20),
        "loaded {loaded} bytes over a floor of {floor}"
    );
    let (first, reloaded) = answer(&worker);
    assert_eq!(reloaded, None);
    assert!(!first.is_empty());

    let start = Instant::now();
    while worker.activity().loaded {
        assert!(start.elapsed() < Duration::from_secs(30), "never unloaded");
        std::thread::sleep(Duration::from_millis(10));
    }
    let unloaded = mlx_bytes();
    eprintln!("MLX bytes: {floor} before loading, {loaded} loaded, {unloaded} after the unload");
    assert!(
        unloaded <= floor + floor / 20,
        "after the unload MLX holds {unloaded} bytes, against {floor} before loading ({loaded} loaded)"
    );

    let (again, reloaded) = answer(&worker);
    assert!(
        reloaded.is_some(),
        "the request after the unload reloaded the pair"
    );
    assert_eq!(again, first, "the reloaded pair answers as before");
}
