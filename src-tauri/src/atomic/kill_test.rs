//! A test harness for state files under SIGKILL, shared by the settings and
//! the history tests. A child process (the test binary itself, running one
//! ignored test) saves numbered contents in a loop and is killed at random
//! moments, round after round. Before each kill the parent waits until the
//! child has saved something new (so a slow, loaded machine still makes
//! progress every round), then waits a varying few milliseconds more, so the
//! kill lands at a random point of the loop; on every other round it then
//! also waits for the temp file to appear and kills within the next
//! millisecond, inside a write (about half the kills land inside one: the
//! count is printed). After each kill the file must parse, carry a number
//! at least as high as any seen before (it never goes back), and temp files
//! must not pile up. Reads while the child writes must parse too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one round may wait for the child's next save. Generous: a
/// loaded machine (builds sharing two cores) can stall a child for seconds.
const DEADLINE: Duration = Duration::from_secs(120);

/// Set in the child: the file it writes.
const CHILD_ENV: &str = "FLASHBAR_TEST_KILLED_WRITER";

/// In a writer child: the file to write; `None` when this is no child (the
/// ignored test then does nothing).
pub fn child_path() -> Option<PathBuf> {
    std::env::var_os(CHILD_ENV).map(PathBuf::from)
}

/// Runs `rounds` rounds of start, wait for a new save, kill, check.
/// `child_test` is the writer's full test name; `number` reads the saved
/// file's number (`Ok(None)`: no file yet; `Err`: unreadable or not what
/// the writer wrote).
pub fn kill_writers(
    child_test: &str,
    path: &Path,
    rounds: u32,
    number: impl Fn(&Path) -> Result<Option<u64>, String>,
) {
    let mut random = Random::new();
    let mut last: Option<u64> = None;
    // Rounds whose kill left the temp file: it landed inside a write.
    let mut inside_writes = 0;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", child_test, "--ignored", "--test-threads=1"])
            .env(CHILD_ENV, path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let seen = wait_for_a_new_save(&mut child, path, last, &number)
            .unwrap_or_else(|e| panic!("round {round} (seed {}): {e}", random.seed));
        std::thread::sleep(Duration::from_micros(random.below(25_000)));
        if round % 2 == 0 {
            // Aim inside a write: once the temp file is there, a moment more.
            let aim = Instant::now();
            while !temp_file_left(path) && aim.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(random.below(1_000)));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if temp_file_left(path) {
            inside_writes += 1;
        }
        let saved = number(path)
            .unwrap_or_else(|e| panic!("round {round} (seed {}): unreadable: {e}", random.seed));
        match saved {
            Some(n) if n >= seen => last = Some(n),
            other => panic!(
                "round {round} (seed {}): the file went back to {other:?} from {seen}",
                random.seed
            ),
        }
    }
    eprintln!("{child_test}: {inside_writes} of {rounds} kills landed inside a write");
    let dir = path.parent().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    assert!(left.len() <= 2, "temp files pile up: {left:?}");
    assert!(last.is_some_and(|n| n + 1 >= u64::from(rounds)), "{last:?}");
}

/// Whether the writer's temp file is there (see [`super::write`]).
fn temp_file_left(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp")).exists()
}

/// Polls the file until it holds a number above `last`, and returns it.
fn wait_for_a_new_save(
    child: &mut Child,
    path: &Path,
    last: Option<u64>,
    number: &impl Fn(&Path) -> Result<Option<u64>, String>,
) -> Result<u64, String> {
    let start = Instant::now();
    loop {
        // Read while the child writes: it must parse then too.
        match number(path)? {
            Some(n) if last.is_none_or(|l| n > l) => return Ok(n),
            Some(n) if last.is_some_and(|l| n < l) => {
                return Err(format!("the file went back to {n} from {last:?}"))
            }
            _ => {}
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return Err(format!("the writer exited ({status}): {stderr}"));
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no new save within {DEADLINE:?} (last {last:?})"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// xorshift64, seeded from the clock; the seed is in every failure.
struct Random {
    seed: u64,
    state: u64,
}

impl Random {
    fn new() -> Random {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let seed = nanos ^ u64::from(std::process::id()) | 1;
        Random { seed, state: seed }
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state % bound
    }
}
