//! The per-thread worker context: enter/restore, seeded generators, nesting.

use longshore_data::rng::{Rng, below};
use longshore_data::{WorkerInfo, worker};

fn draw() -> u64 {
    worker::with_rng(|r: &mut Rng| below(r, 1 << 40))
}

#[test]
fn worker_generators_are_seeded_and_restored() {
    let outside = std::thread::spawn(|| (draw(), draw())).join().unwrap();
    let outside_again = std::thread::spawn(|| (draw(), draw())).join().unwrap();
    assert_eq!(outside, outside_again, "fallback generator is seeded too");

    let seq = |seed| {
        std::thread::spawn(move || {
            let _g = worker::enter(WorkerInfo::new(0, 4, seed).unwrap());
            (0..5).map(|_| draw()).collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    };
    assert_eq!(seq(11), seq(11));
    assert_ne!(seq(11), seq(12));

    // Nested enter restores the outer context on drop.
    let outer = worker::enter(WorkerInfo::new(1, 2, 1).unwrap());
    {
        let _inner = worker::enter(WorkerInfo::new(0, 2, 2).unwrap());
        assert_eq!(worker::current().unwrap().id, 0);
    }
    assert_eq!(worker::current().unwrap().id, 1);
    drop(outer);
    assert_eq!(worker::current(), None);
}

#[test]
fn nested_with_rng_does_not_panic() {
    let _g = worker::enter(WorkerInfo::single(3));
    let (a, b) = worker::with_rng(|r| (below(r, 100), draw()));
    assert!(a < 100 && b < 1 << 40);
    // The worker generator is back in place afterwards.
    assert!(worker::current().is_some());
    let _ = draw();
}
