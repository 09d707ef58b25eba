//! Ranks of a data-parallel job as threads of one process: a [`Gate`] that keeps them in step
//! and that a failing rank breaks open, and [`world`] to run them. The `ranks` sections of
//! `longshore-bench` and `jpeg-bench` measure one loader per GPU with it.

use std::sync::{Condvar, Mutex};

use anyhow::{Result, bail};

/// A reusable barrier that a failing rank breaks open, so no rank waits for one that will
/// never arrive.
pub struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
    ranks: usize,
}

struct GateState {
    arrived: usize,
    generation: u64,
    broken: bool,
}

impl Gate {
    /// A gate for `ranks` ranks.
    pub fn new(ranks: usize) -> Self {
        Self {
            state: Mutex::new(GateState {
                arrived: 0,
                generation: 0,
                broken: false,
            }),
            cv: Condvar::new(),
            ranks,
        }
    }

    /// Waits until every rank arrived; an error once another rank failed.
    pub fn wait(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.broken {
            bail!(RELEASED);
        }
        st.arrived += 1;
        if st.arrived == self.ranks {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let generation = st.generation;
        while st.generation == generation && !st.broken {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.generation == generation {
            bail!(RELEASED);
        }
        Ok(())
    }

    /// Releases every waiting rank, now and later, with an error.
    pub fn break_open(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.broken = true;
        self.cv.notify_all();
    }
}

/// Runs `f(rank, gate)` for `ranks` ranks, each on its own thread, sharing one [`Gate`]; the
/// results in rank order. A rank that fails or panics breaks the gate open, so the others
/// return instead of waiting for it; the error returned is the first rank's own failure (a
/// rank only released by the gate reports "another rank failed").
pub fn world<T: Send>(
    ranks: usize,
    f: impl Fn(usize, &Gate) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let gate = Gate::new(ranks);
    let outcomes: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (gate, f) = (&gate, &f);
                s.spawn(move || {
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(rank, gate)))
                            .unwrap_or_else(|p| {
                                let msg = p
                                    .downcast_ref::<&str>()
                                    .map(|s| (*s).to_owned())
                                    .or_else(|| p.downcast_ref::<String>().cloned())
                                    .unwrap_or_default();
                                bail!("rank {rank} panicked: {msg}")
                            });
                    if r.is_err() {
                        gate.break_open();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut out = Vec::with_capacity(ranks);
    let mut released = None;
    for (rank, r) in outcomes.into_iter().enumerate() {
        match r {
            Ok(v) => out.push(v),
            Err(e) if e.to_string() == RELEASED => {
                released.get_or_insert(e.context(format!("rank {rank} of {ranks}")));
            }
            Err(e) => return Err(e.context(format!("rank {rank} of {ranks}"))),
        }
    }
    match released {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

const RELEASED: &str = "another rank failed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_gate_releases_the_waiting_ranks() {
        let gate = Gate::new(3);
        std::thread::scope(|s| {
            let a = s.spawn(|| gate.wait());
            let b = s.spawn(|| gate.wait());
            std::thread::sleep(std::time::Duration::from_millis(20));
            gate.break_open();
            assert!(a.join().unwrap().is_err());
            assert!(b.join().unwrap().is_err());
        });
        assert!(gate.wait().is_err(), "a broken gate stays broken");
    }

    #[test]
    fn the_gate_is_reusable() {
        let gate = Gate::new(2);
        std::thread::scope(|s| {
            let h = s.spawn(|| (0..5).try_for_each(|_| gate.wait()));
            (0..5).try_for_each(|_| gate.wait()).unwrap();
            h.join().unwrap().unwrap();
        });
    }

    #[test]
    fn world_returns_results_in_rank_order() {
        let got = world(4, |rank, gate| {
            gate.wait()?;
            Ok(rank * 10)
        })
        .unwrap();
        assert_eq!(got, vec![0, 10, 20, 30]);
    }

    #[test]
    fn a_failing_rank_is_the_error_and_frees_the_others() {
        let err = world(3, |rank, gate| {
            if rank == 2 {
                bail!("disk on fire");
            }
            gate.wait()?;
            Ok(())
        })
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("rank 2 of 3") && text.contains("disk on fire"),
            "{text}"
        );
    }

    #[test]
    fn a_panicking_rank_is_an_error() {
        let err = world(2, |rank, gate| {
            assert!(rank != 0, "rank zero fell over");
            gate.wait()?;
            Ok(())
        })
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("rank 0 panicked: rank zero fell over"),
            "{text}"
        );
    }
}
