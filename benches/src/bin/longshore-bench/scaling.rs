//! `scaling`: samples/s against num_workers from 1 to twice the core count, every workload,
//! page-locked batches, in steady state (the loader sweep's method; shared points are
//! measured once). Past the knee, more workers should never be more than 5% below the best.

use anyhow::Result;
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::drive::{METHOD, Opts, Workload, ensure_data, steady_run};
use crate::{Best, Ctx};

/// num_workers from 1 to `2 * cores`: powers of two plus half, one and one and a half and two
/// times the core count.
pub(crate) fn grid(cores: usize) -> Vec<usize> {
    let top = 2 * cores.max(1);
    let mut g: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2))
        .take_while(|&n| n <= top)
        .chain([cores / 2, cores, cores + cores / 2, top])
        .filter(|&n| (1..=top).contains(&n))
        .collect();
    g.sort_unstable();
    g.dedup();
    g
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let cores = ctx.results.machine.cores;
    let workers = grid(cores);
    ctx.results.note(
        "scaling",
        format!("num_workers {workers:?} on {cores} cores, pin_memory=true; method: {METHOD}"),
    );
    let mut rows = Vec::new();
    for w in Workload::ALL {
        let mut curve = Vec::new();
        let mut details = Vec::new();
        for &nw in &workers {
            let r = steady_run(
                ctx,
                &files,
                w,
                Opts {
                    num_workers: nw,
                    pin_memory: true,
                },
            )?;
            ctx.results.push(
                "scaling",
                format!("{} workers={nw}", w.name()),
                r.samples_per_s,
                "samples/s",
                json!({"workload": w.name(), "num_workers": nw, "pin_memory": true,
                       "wait": r.wait_fraction, "batches": r.batches, "epochs": r.epochs,
                       "worker_ms_per_batch": r.worker_ms_per_batch}),
            );
            curve.push((nw, r.samples_per_s));
            details.push((r.wait_fraction, r.worker_ms_per_batch));
            // The roofline takes the best rate of the run: the loader sweep's grid or this one.
            Best::offer(
                &mut ctx.best,
                w.name(),
                Best {
                    samples_per_s: r.samples_per_s,
                    num_workers: nw,
                    pin_memory: true,
                },
            );
        }
        let (best_nw, best) = curve
            .iter()
            .copied()
            .fold((0, 0.0), |b, p| if p.1 > b.1 { p } else { b });
        // The worst point past the best: how much slower more workers make it.
        let (worst_nw, worst) = curve
            .iter()
            .copied()
            .filter(|&(nw, _)| nw > best_nw)
            .fold((best_nw, best), |b, p| if p.1 < b.1 { p } else { b });
        let drop = if best > 0.0 { 1.0 - worst / best } else { 0.0 };
        ctx.results.push(
            "scaling",
            format!("{} past the knee: worst below the best", w.name()),
            drop,
            "fraction",
            json!({"workload": w.name(), "what": "knee", "best_workers": best_nw,
                   "worst_workers": worst_nw, "target": 0.05}),
        );
        for ((nw, sps), (wait, worker_ms)) in curve.iter().zip(&details) {
            rows.push(vec![
                w.name().to_owned(),
                nw.to_string(),
                format!("{sps:.0}"),
                format!("{:.0}%", 100.0 * sps / best.max(1e-9)),
                format!("{:.0}%", 100.0 * wait),
                format!("{worker_ms:.2}"),
            ]);
        }
        rows.push(vec![
            w.name().to_owned(),
            "knee".to_owned(),
            format!("best at {best_nw}"),
            format!(
                "worst past it: {worst_nw} workers, {:.1}% below (target <= 5%)",
                100.0 * drop
            ),
            String::new(),
            String::new(),
        ]);
    }
    print_table(
        &format!("scaling: samples/s against num_workers ({cores} cores, pin_memory)"),
        &[
            "workload",
            "workers",
            "samples/s",
            "of best",
            "consumer waited",
            "worker ms/batch",
        ],
        &rows,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::grid;

    #[test]
    fn the_grid_runs_from_one_to_twice_the_cores() {
        assert_eq!(grid(16), vec![1, 2, 4, 8, 16, 24, 32]);
        assert_eq!(grid(2), vec![1, 2, 3, 4]);
        assert_eq!(grid(1), vec![1, 2]);
    }
}
