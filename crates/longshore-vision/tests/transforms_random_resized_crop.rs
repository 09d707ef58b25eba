//! RandomResizedCrop draws its boxes from torchvision's distribution: two-sample
//! Kolmogorov-Smirnov tests of area fraction, aspect ratio and position against 4,000 draws
//! of torchvision's `RandomResizedCrop.get_params` (golden files from
//! `tests/golden/make_golden.py`), on a typical image, a wide one (where the central-crop
//! fallback is taken about 5% of the time) and a tiny one (where rounding dominates). Both samples come from
//! fixed seeds, so the test is deterministic; the threshold is the KS critical value at
//! alpha = 0.001.

use std::path::PathBuf;

use longshore_data::NpyArray;
use longshore_data::rng::epoch_rng;
use longshore_vision::transforms::{CropBox, RandomResizedCrop};

fn torchvision_boxes(w: usize, h: usize) -> Vec<CropBox> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/rrc_{w}x{h}.npy"));
    let a = NpyArray::open(path).unwrap();
    a.as_slice::<i64>()
        .unwrap()
        .chunks_exact(4)
        .map(|b| CropBox {
            top: b[0],
            left: b[1],
            height: b[2] as usize,
            width: b[3] as usize,
        })
        .collect()
}

fn our_boxes(w: usize, h: usize, n: usize) -> Vec<CropBox> {
    let rrc = RandomResizedCrop::new(224).unwrap();
    let mut rng = epoch_rng(42, 0);
    (0..n).map(|_| rrc.get_params(w, h, &mut rng)).collect()
}

/// The two-sample KS statistic.
fn ks(mut a: Vec<f64>, mut b: Vec<f64>) -> f64 {
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (mut i, mut j, mut d) = (0, 0, 0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

fn critical(n: usize, m: usize) -> f64 {
    1.949 * (((n + m) as f64) / (n * m) as f64).sqrt()
}

fn check(w: usize, h: usize) {
    let theirs = torchvision_boxes(w, h);
    let ours = our_boxes(w, h, theirs.len());
    for b in &ours {
        assert!(b.top >= 0 && b.left >= 0, "{b:?}");
        assert!(
            b.top as usize + b.height <= h && b.left as usize + b.width <= w,
            "{b:?} outside {w}x{h}"
        );
        assert!(b.width > 0 && b.height > 0);
    }
    let area = |v: &[CropBox]| {
        v.iter()
            .map(|b| (b.width * b.height) as f64 / (w * h) as f64)
            .collect::<Vec<_>>()
    };
    let aspect = |v: &[CropBox]| {
        v.iter()
            .map(|b| (b.width as f64 / b.height as f64).ln())
            .collect::<Vec<_>>()
    };
    let top = |v: &[CropBox]| {
        v.iter()
            .map(|b| {
                if b.height < h {
                    b.top as f64 / (h - b.height) as f64
                } else {
                    0.5
                }
            })
            .collect::<Vec<_>>()
    };
    let left = |v: &[CropBox]| {
        v.iter()
            .map(|b| {
                if b.width < w {
                    b.left as f64 / (w - b.width) as f64
                } else {
                    0.5
                }
            })
            .collect::<Vec<_>>()
    };
    let crit = critical(ours.len(), theirs.len());
    for (what, d) in [
        ("area fraction", ks(area(&ours), area(&theirs))),
        ("log aspect ratio", ks(aspect(&ours), aspect(&theirs))),
        ("relative top", ks(top(&ours), top(&theirs))),
        ("relative left", ks(left(&ours), left(&theirs))),
    ] {
        println!("{w}x{h} {what}: KS D = {d:.4} (critical {crit:.4})");
        assert!(d < crit, "{w}x{h} {what}: D = {d:.4} >= {crit:.4}");
    }
}

#[test]
fn boxes_match_torchvision_on_a_typical_image() {
    check(400, 300);
}

#[test]
fn boxes_match_torchvision_on_a_wide_image_with_fallbacks() {
    check(300, 100);
    // The central-crop fallback: full height, width round(100 * 4/3) = 133, centred.
    let fallback = CropBox {
        top: 0,
        left: (300 - 133) / 2,
        height: 100,
        width: 133,
    };
    let share =
        |v: &[CropBox]| v.iter().filter(|b| **b == fallback).count() as f64 / v.len() as f64;
    let (ours, theirs) = (
        share(&our_boxes(300, 100, 4000)),
        share(&torchvision_boxes(300, 100)),
    );
    println!("fallback share: ours {ours:.4}, torchvision {theirs:.4}");
    assert!(theirs > 0.01, "the golden draws exercise the fallback");
    // Binomial standard error at n = 4000, 5 sigma.
    let se = (theirs * (1.0 - theirs) / 4000.0).sqrt() * 2f64.sqrt();
    assert!((ours - theirs).abs() < 5.0 * se, "{ours} vs {theirs}");
}

#[test]
fn boxes_match_torchvision_on_a_tiny_image() {
    check(37, 29);
}
