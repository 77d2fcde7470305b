//! Idle unload with the real engine on the embedded pair: once the worker
//! has unloaded the model, MLX's memory (arrays in use plus its buffer
//! cache) is back within 5% of what it was before the model was loaded; on
//! Linux the process gives back at least 90% of the resident memory the
//! pair and its answer took (anonymous pages: what is left, 2-7 MB from run
//! to run, is the runtime's one-time state and the allocator's
//! fragmentation), a second load and unload ends within the same bound,
//! and no mapping of the pair's files is left;
//! the next request loads the pair again and gives the same answer. Its own
//! test binary: MLX's memory counters and the process's are per process.

use flashbar_engine::{CancelToken, Engine, Event, GenerateRequest, Prompt, Speculation, Worker};
use mlx_rs::memory::{active_memory, cache_memory};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn mlx_bytes() -> usize {
    active_memory().unwrap() + cache_memory().unwrap()
}

/// The process's resident memory from /proc: (anonymous, file-backed)
/// bytes. Anonymous pages are what a model's arrays and the allocator's
/// heap take; file-backed ones are mostly code (libmlx's, paged in on first
/// use) and any mapped weights.
#[cfg(target_os = "linux")]
fn resident() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> usize {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kb: usize = line[name.len()..]
            .trim()
            .trim_end_matches(" kB")
            .parse()
            .unwrap();
        kb * 1024
    };
    (field("RssAnon:"), field("RssFile:"))
}

/// The process's mappings of files under `dir`.
#[cfg(target_os = "linux")]
fn mapped_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.contains(dir.to_str().unwrap()))
        .map(str::to_owned)
        .collect()
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
            Event::Text(_) | Event::Reasoning(_) => {}
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
    #[cfg(target_os = "linux")]
    let (anon_floor, file_floor) = resident();
    #[cfg(target_os = "linux")]
    let pair = root.clone();
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
    // The pair's weights and the run's buffers are in the process's
    // anonymous memory, so the check after the unload measures something.
    #[cfg(target_os = "linux")]
    let anon_loaded = {
        let (anon, _) = resident();
        assert!(
            anon > anon_floor + (16 << 20),
            "loaded and answered, the process holds {anon} anonymous bytes against {anon_floor} before"
        );
        anon
    };

    wait_for_unload(&worker);
    let unloaded = mlx_bytes();
    eprintln!("MLX bytes: {floor} before loading, {loaded} loaded, {unloaded} after the unload");
    #[cfg(target_os = "linux")]
    let anon_unloaded = {
        let (anon, file) = resident();
        eprintln!(
            "resident: anonymous {anon_floor} before loading, {anon_loaded} loaded, {anon} after the unload; \
             file-backed {file_floor} -> {file} bytes"
        );
        assert!(
            anon <= anon_floor + (anon_loaded - anon_floor) / 10,
            "after the unload the process holds {anon} anonymous resident bytes, against {anon_floor} \
             before loading and {anon_loaded} loaded: more than 10% of what the pair took is kept"
        );
        let mapped = mapped_under(&pair);
        assert!(
            mapped.is_empty(),
            "the pair's files are still mapped: {mapped:?}"
        );
        anon
    };
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
    // A second unload comes back to where the first did: nothing grows
    // with each load (a menu-bar app unloads and reloads for days).
    #[cfg(target_os = "linux")]
    {
        wait_for_unload(&worker);
        let (after_second, _) = resident();
        eprintln!("resident after the second unload: anonymous {after_second}");
        assert!(
            after_second <= anon_floor + (anon_loaded - anon_floor) / 10,
            "after a second unload the process holds {after_second} anonymous bytes, \
             {anon_unloaded} after the first (floor {anon_floor})"
        );
    }
}

fn wait_for_unload(worker: &Worker) {
    let start = Instant::now();
    while worker.activity().loaded {
        assert!(start.elapsed() < Duration::from_secs(30), "never unloaded");
        std::thread::sleep(Duration::from_millis(10));
    }
}
