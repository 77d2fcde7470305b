//! The host kernels' threads: the calling thread and a helper per other
//! core split each product, recurrence or attention, and a helper keeps
//! spinning a short while after its part, so the next call of the same
//! forward finds it awake (docs/cpu.md, "Threads"). A forward makes some
//! 30 such calls a few tens of microseconds apart; rayon woke a sleeping
//! worker and put the caller to sleep for each (a futex round trip both
//! ways), and a decode step spent about a fifth of its time in the kernel's
//! scheduler.
//!
//! Which thread runs a part never changes what it computes. A second caller
//! while the helpers are busy (tests, two engines) runs its parts itself; a
//! call from inside a part does too.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper spins for the next call before it sleeps: longer than
/// the gaps inside a forward, far shorter than the time between answers.
const SPIN: Duration = Duration::from_micros(300);

/// Helper threads at most (so at most this many + 1 run a call).
const MAX_HELPERS: usize = 7;

/// Threads a call runs on (the caller included): this many, at most the
/// cores and `MAX_HELPERS + 1`; 1 runs every part on the caller.
pub const THREADS_ENV: &str = "FLASHBAR_HOST_THREADS";

/// Parts one call may have (more are run as several calls).
const MAX_PARTS: usize = 0xFFFF;

/// One call's parts, as the helpers see them. `next` holds, in one word,
/// the call's generation (high 32 bits), its number of parts (next 16) and
/// the next part to claim (low 16): a part is claimed by one
/// compare-and-swap of the whole word, so a helper whose reading of `next`
/// is stale (an earlier call's) can never claim a part. The part count
/// must live in that word: read from a field of its own, a helper could
/// pair an ended call's last `next` with the following call's count and
/// claim a part that does not exist, then call a job that has returned.
struct Shared {
    next: AtomicU64,
    done: AtomicUsize,
    /// The address of the caller's `&dyn Fn(usize)`, valid until `done`
    /// reaches `parts`.
    job: AtomicUsize,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

struct Pool {
    shared: &'static Shared,
    helpers: usize,
    busy: AtomicBool,
    generation: AtomicU64,
}

type Job<'a> = &'a (dyn Fn(usize) + Sync);

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = std::env::var(THREADS_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(cores)
            .clamp(1, cores.min(MAX_HELPERS + 1));
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            next: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        }));
        let mut helpers = 0;
        for i in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("flashbar-host-{i}"))
                .spawn(move || helper(shared));
            helpers += usize::from(spawned.is_ok());
        }
        Pool {
            shared,
            helpers,
            busy: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }
    })
}

/// How many threads a call may run on (the caller included).
pub fn threads() -> usize {
    pool().helpers + 1
}

/// `f(job)` for every job, spread over the caller and the helpers; returns
/// once all are done. A panic in a job is raised again here.
pub fn each<T: Send>(jobs: Vec<T>, f: impl Fn(T) + Sync) {
    let slots: Vec<Mutex<Option<T>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let run = |i: usize| {
        let job = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            f(job);
        }
    };
    for_each_index(slots.len(), &run);
}

/// The `next` word of part `part` of call `generation` of `parts` parts.
fn word(generation: u64, parts: usize, part: usize) -> u64 {
    (generation << 32) | ((parts as u64) << 16) | part as u64
}

fn for_each_index(parts: usize, f: Job<'_>) {
    if parts > MAX_PARTS {
        for start in (0..parts).step_by(MAX_PARTS) {
            let end = (start + MAX_PARTS).min(parts);
            for_each_index(end - start, &|i| f(start + i));
        }
        return;
    }
    let pool = pool();
    if parts <= 1 || pool.helpers == 0 || pool.busy.swap(true, SeqCst) {
        (0..parts).for_each(f);
        return;
    }
    let shared = pool.shared;
    let generation = pool.generation.fetch_add(1, SeqCst).wrapping_add(1) & 0xFFFF_FFFF;
    shared.done.store(0, SeqCst);
    shared.job.store(&f as *const Job<'_> as usize, SeqCst);
    shared.next.store(word(generation, parts, 0), SeqCst);
    if shared.sleepers.load(SeqCst) > 0 {
        let _held = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
        shared.wake.notify_all();
    }
    work(shared, generation);
    while shared.done.load(SeqCst) < parts {
        std::hint::spin_loop();
    }
    let panic = shared
        .panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    pool.busy.store(false, SeqCst);
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// Claims and runs parts of call `generation` until none is left.
fn work(shared: &Shared, generation: u64) {
    loop {
        let current = shared.next.load(SeqCst);
        let parts = ((current >> 16) & 0xFFFF) as usize;
        let part = (current & 0xFFFF) as usize;
        if current >> 32 != generation || part >= parts {
            return;
        }
        let job = shared.job.load(SeqCst);
        if shared
            .next
            .compare_exchange(current, current + 1, SeqCst, SeqCst)
            .is_err()
        {
            continue;
        }
        // SAFETY: part `part` of this generation is claimed, and it exists
        // (`parts` came from the same word), so the call has not returned
        // (it waits for `done` to count this part); `job` was stored before
        // the generation was published and is not stored again before the
        // call returns: the caller's `&dyn Fn` is alive.
        let f = unsafe { *(job as *const Job<'_>) };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(part))) {
            let mut slot = shared.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(payload);
        }
        shared.done.fetch_add(1, SeqCst);
    }
}

fn helper(shared: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let since = Instant::now();
        let mut spins = 0u32;
        loop {
            let generation = shared.next.load(SeqCst) >> 32;
            if generation != seen {
                seen = generation;
                work(shared, generation);
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && since.elapsed() > SPIN {
                let mut held = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, SeqCst);
                while shared.next.load(SeqCst) >> 32 == seen {
                    held = shared.wake.wait(held).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job runs once, whoever runs it, from several callers at once
    /// and from inside a job.
    #[test]
    fn every_job_runs_once() {
        let callers: Vec<_> = (0..4)
            .map(|c| {
                std::thread::spawn(move || {
                    for round in 0..200 {
                        let n = 1 + (round * 7 + c) % 40;
                        let mut out = vec![0usize; n];
                        let jobs: Vec<(usize, &mut usize)> = out.iter_mut().enumerate().collect();
                        each(jobs, |(i, slot)| {
                            let inner = AtomicUsize::new(0);
                            each((0..3).collect(), |_: i32| {
                                inner.fetch_add(1, SeqCst);
                            });
                            *slot = i * 10 + inner.load(SeqCst);
                        });
                        let expected: Vec<usize> = (0..n).map(|i| i * 10 + 3).collect();
                        assert_eq!(out, expected);
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.join().unwrap();
        }
    }

    /// A panic in a job reaches the caller, and the threads still serve the
    /// next call.
    #[test]
    fn a_panic_reaches_the_caller() {
        let caught = catch_unwind(|| {
            each((0..16).collect(), |i: usize| {
                if i == 11 {
                    panic!("job {i}");
                }
            })
        });
        assert!(caught.is_err());
        let sum = AtomicUsize::new(0);
        each((0..16).collect(), |i: usize| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 120);
    }

    /// Calls of different part counts back to back, as a forward makes
    /// them: every part runs exactly once. Before the part count moved into
    /// `next`, a helper late from one call could claim a part past the end
    /// of the next one and run a job that had returned: this failed (a
    /// miscount or SIGSEGV) within 3 million calls in five runs out of five
    /// on two cores, and crashed `flashbar serve` once in CI.
    #[test]
    fn back_to_back_calls_of_different_sizes_run_each_part_once() {
        let mut miscounted = 0usize;
        for call in 0..3_000_000usize {
            let parts = if call % 2 == 0 { 2 } else { 7 };
            let runs: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            for_each_index(parts, &|i: usize| {
                runs[i].fetch_add(1, SeqCst);
            });
            miscounted += usize::from(runs.iter().any(|r| r.load(SeqCst) != 1));
        }
        assert_eq!(miscounted, 0);
    }

    /// More parts than one call's word can count run as several calls.
    #[test]
    fn more_parts_than_a_call_holds_all_run_once() {
        let parts = MAX_PARTS * 2 + 5;
        let runs: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        for_each_index(parts, &|i: usize| {
            runs[i].fetch_add(1, SeqCst);
        });
        assert!(runs.iter().all(|r| r.load(SeqCst) == 1));
    }
}
