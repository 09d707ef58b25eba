//! The `ops` module on the Cpu device agrees with naive references, for random shapes,
//! transposes, scales and byte offsets; size, alignment and argument mistakes are errors; and
//! operations order themselves after copies on other streams.

use longshore_ops::{
    self as ops, Activation, CrossEntropyArgs, CrossEntropyStats, GemmArgs, NormalizeU8, Sgd, View,
    ViewMut,
};
use longshore_transfer::{Device, DeviceBuffer, Stream, TransferError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn randn(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `data` placed `pad` f32 values into a new device buffer with `tail` spare values after it.
fn put(s: &Stream, pad: usize, data: &[f32], tail: usize) -> DeviceBuffer {
    let mut v = vec![f32::NAN; pad];
    v.extend_from_slice(data);
    v.extend(std::iter::repeat_n(f32::NAN, tail));
    s.to_device(&v).unwrap()
}

fn get(s: &Stream, b: &DeviceBuffer, pad: usize, n: usize) -> Vec<f32> {
    s.read_to_vec::<f32>(b).unwrap()[pad..pad + n].to_vec()
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn naive_gemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    ta: bool,
    b: &[f32],
    tb: bool,
    beta: f32,
    c: &[f32],
) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f64;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                acc += f64::from(av) * f64::from(bv);
            }
            let old = if beta == 0.0 {
                0.0
            } else {
                f64::from(beta) * f64::from(c[i * n + j])
            };
            out[i * n + j] = f64::from(alpha) * acc + old;
        }
    }
    out
}

#[test]
fn gemm_matches_naive_for_random_shapes_transposes_and_offsets() {
    let s = Device::cpu().new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for case in 0..60 {
        let (m, n, k) = (
            rng.random_range(1..40),
            rng.random_range(1..40),
            rng.random_range(1..70),
        );
        let (ta, tb) = (rng.random_bool(0.5), rng.random_bool(0.5));
        let alpha = rng.random_range(-2.0f32..2.0);
        let beta = if case % 3 == 0 {
            0.0
        } else {
            rng.random_range(-1.0f32..1.0)
        };
        let (pa, pb, pc) = (
            rng.random_range(0..9),
            rng.random_range(0..9),
            rng.random_range(0..9),
        );
        let (a, b, c) = (
            randn(&mut rng, m * k),
            randn(&mut rng, k * n),
            randn(&mut rng, m * n),
        );
        let da = put(&s, pa, &a, 3);
        let db = put(&s, pb, &b, 0);
        // With beta == 0, C's old contents must not be read: start it as NaN.
        let c0: Vec<f32> = if beta == 0.0 {
            vec![f32::NAN; m * n]
        } else {
            c.clone()
        };
        let mut dc = put(&s, pc, &c0, 2);
        ops::gemm(
            &s,
            GemmArgs::new(
                m,
                n,
                k,
                View::new(&da, pa * 4),
                View::new(&db, pb * 4),
                ViewMut::new(&mut dc, pc * 4),
            )
            .trans_a(ta)
            .trans_b(tb)
            .scale(alpha, beta),
        )
        .unwrap();
        let want = naive_gemm(m, n, k, alpha, &a, ta, &b, tb, beta, &c);
        let all = s.read_to_vec::<f32>(&dc).unwrap();
        close(
            &all[pc..pc + m * n],
            &want,
            1e-4,
            &format!("case {case}: {m}x{n}x{k} ta={ta} tb={tb} alpha={alpha} beta={beta}"),
        );
        // Nothing outside C was written.
        assert!(
            all[..pc]
                .iter()
                .chain(&all[pc + m * n..])
                .all(|v| v.is_nan())
        );
    }
}

#[test]
fn layer_ops_match_naive() {
    let s = Device::cpu().new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    for case in 0..20 {
        let (rows, cols) = (rng.random_range(1..50), rng.random_range(1..30));
        let pad = rng.random_range(0..5);
        let y = randn(&mut rng, rows * cols);
        let bias = randn(&mut rng, cols);
        let act = if case % 2 == 0 {
            Activation::Relu
        } else {
            Activation::Identity
        };
        let mut dy = put(&s, pad, &y, 1);
        let db = put(&s, 1, &bias, 0);
        ops::bias_act(
            &s,
            ViewMut::new(&mut dy, pad * 4),
            View::new(&db, 4),
            rows,
            cols,
            act,
        )
        .unwrap();
        let want: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let v = f64::from(y[i]) + f64::from(bias[i % cols]);
                if act == Activation::Relu {
                    v.max(0.0)
                } else {
                    v
                }
            })
            .collect();
        let out = get(&s, &dy, pad, rows * cols);
        close(&out, &want, 1e-6, "bias_act");

        // ReLU backward masks the gradient where the output is not positive.
        let g = randn(&mut rng, rows * cols);
        let mut dg = put(&s, 0, &g, 0);
        ops::relu_backward(
            &s,
            ViewMut::from(&mut dg),
            View::new(&dy, pad * 4),
            rows * cols,
        )
        .unwrap();
        let want: Vec<f64> = g
            .iter()
            .zip(&out)
            .map(|(g, o)| if *o > 0.0 { f64::from(*g) } else { 0.0 })
            .collect();
        close(&get(&s, &dg, 0, rows * cols), &want, 0.0, "relu_backward");

        // Bias gradient: column sums (overwrites what was there).
        let mut dsum = put(&s, 2, &vec![5.0; cols], 0);
        ops::bias_grad(
            &s,
            View::new(&dg, 0),
            rows,
            cols,
            ViewMut::new(&mut dsum, 8),
        )
        .unwrap();
        let want: Vec<f64> = (0..cols)
            .map(|j| (0..rows).map(|r| want[r * cols + j]).sum())
            .collect();
        close(&get(&s, &dsum, 2, cols), &want, 1e-5, "bias_grad");
    }
}

#[test]
fn softmax_cross_entropy_matches_naive_and_accumulates() {
    let s = Device::cpu().new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let (rows, classes) = (37, 10);
    let logits: Vec<f32> = (0..rows * classes)
        .map(|_| rng.random_range(-5.0f32..5.0))
        .collect();
    let mut labels: Vec<i64> = (0..rows).map(|_| rng.random_range(0..10)).collect();
    labels[4] = -1;
    labels[9] = 10;
    // Labels after 24 f32 of something else, like a batch's second tensor (8-byte aligned).
    let mut storage: Vec<u8> = vec![0; 96];
    storage.extend_from_slice(bytemuck::cast_slice(&labels));
    let dl = put(&s, 0, &logits, 0);
    let dlab = s.to_device(&storage).unwrap();
    let mut dg = s.alloc(rows * classes * 4).unwrap();
    let mut stats = s.alloc_zeroed(CrossEntropyStats::LEN * 4).unwrap();
    for _ in 0..2 {
        ops::softmax_cross_entropy(
            &s,
            CrossEntropyArgs {
                logits: View::from(&dl),
                labels: View::new(&dlab, 96),
                rows,
                classes,
                grad: ViewMut::from(&mut dg),
                grad_scale: 0.5,
                stats: ViewMut::from(&mut stats),
            },
        )
        .unwrap();
    }
    let (mut loss, mut correct) = (0f64, 0u64);
    let mut want_g = vec![0f64; rows * classes];
    for r in 0..rows {
        let z: Vec<f64> = logits[r * classes..(r + 1) * classes]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let y = labels[r];
        if !(0..10).contains(&y) {
            continue;
        }
        let max = z.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
        loss += sum.ln() + max - z[y as usize];
        let arg = (0..classes)
            .max_by(|&a, &b| z[a].partial_cmp(&z[b]).unwrap())
            .unwrap();
        correct += u64::from(arg == y as usize);
        for c in 0..classes {
            let p = (z[c] - max).exp() / sum;
            want_g[r * classes + c] = (p - if c == y as usize { 1.0 } else { 0.0 }) * 0.5;
        }
    }
    close(&get(&s, &dg, 0, rows * classes), &want_g, 1e-5, "grad");
    let st = CrossEntropyStats::from_slice(&s.read_to_vec::<f32>(&stats).unwrap()).unwrap();
    assert!(
        (st.loss_sum - 2.0 * loss).abs() < 1e-3 * loss,
        "{st:?} vs {loss}"
    );
    assert_eq!(st.correct, 2 * correct);
    assert_eq!(st.invalid_labels, 4);
}

#[test]
fn sgd_momentum_matches_pytorch_update() {
    let s = Device::cpu().new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let n = 1000;
    let (mut w, g1, g2) = (randn(&mut rng, n), randn(&mut rng, n), randn(&mut rng, n));
    let mut dw = put(&s, 3, &w, 0);
    let mut dv = s.alloc_zeroed(n * 4).unwrap();
    let sgd = Sgd {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
    };
    let mut v = vec![0f32; n];
    for g in [&g1, &g2] {
        let dg = put(&s, 0, g, 0);
        ops::sgd_momentum(
            &s,
            ViewMut::new(&mut dw, 12),
            ViewMut::from(&mut dv),
            View::from(&dg),
            n,
            sgd,
        )
        .unwrap();
        for i in 0..n {
            let gi = g[i] + 0.01 * w[i];
            v[i] = 0.9 * v[i] + gi;
            w[i] -= 0.1 * v[i];
        }
    }
    let want: Vec<f64> = w.iter().map(|&x| f64::from(x)).collect();
    close(&get(&s, &dw, 3, n), &want, 1e-6, "sgd");
}

#[test]
fn normalize_u8_matches_formula() {
    let s = Device::cpu().new_stream().unwrap();
    let (images, h, w) = (3, 5, 7);
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    let norm = NormalizeU8::new(&s, &mean, &std, h, w).unwrap();
    assert_eq!(norm.image_len(), 3 * h * w);
    let n = images * norm.image_len();
    let mut bytes = vec![0u8; 5];
    bytes.extend((0..n).map(|i| (i * 37 % 256) as u8));
    let src = s.to_device(&bytes).unwrap();
    let mut dst = s.alloc(n * 4 + 8).unwrap();
    ops::normalize_u8(
        &s,
        &norm,
        View::new(&src, 5),
        ViewMut::new(&mut dst, 8),
        images,
    )
    .unwrap();
    let want: Vec<f64> = (0..n)
        .map(|i| {
            let c = (i / (h * w)) % 3;
            (f64::from(bytes[5 + i]) / 255.0 - f64::from(mean[c])) / f64::from(std[c])
        })
        .collect();
    close(&get(&s, &dst, 2, n), &want, 1e-5, "normalize_u8");
}

#[test]
fn mistakes_are_errors_not_ub() {
    let s = Device::cpu().new_stream().unwrap();
    let a = s.alloc_zeroed(4 * 6).unwrap();
    let b = s.alloc_zeroed(4 * 6).unwrap();
    let mut c = s.alloc_zeroed(4 * 4).unwrap();
    // 2x3 * 3x2 fits; 2x3 * 3x3 does not fit B or C.
    ops::gemm(
        &s,
        GemmArgs::new(
            2,
            2,
            3,
            View::from(&a),
            View::from(&b),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap();
    let e = ops::gemm(
        &s,
        GemmArgs::new(
            2,
            3,
            3,
            View::from(&a),
            View::from(&b),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::OutOfBounds {
                op: "gemm",
                bytes: 36,
                offset: 0,
                capacity: 24
            }
        ),
        "{e}"
    );
    // An offset pushing A past its end.
    let e = ops::gemm(
        &s,
        GemmArgs::new(
            2,
            2,
            3,
            View::new(&a, 4),
            View::from(&b),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap_err();
    assert!(
        matches!(e, TransferError::OutOfBounds { offset: 4, .. }),
        "{e}"
    );
    // A misaligned f32 offset.
    let e = ops::gemm(
        &s,
        GemmArgs::new(
            1,
            1,
            1,
            View::new(&a, 2),
            View::from(&b),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
    // Zero sizes.
    let e = ops::relu_backward(&s, ViewMut::from(&mut c), View::from(&a), 0).unwrap_err();
    assert!(matches!(e, TransferError::Invalid(_)), "{e}");
    // Sizes whose product overflows.
    let e = ops::bias_act(
        &s,
        ViewMut::from(&mut c),
        View::from(&a),
        usize::MAX,
        2,
        Activation::Relu,
    )
    .unwrap_err();
    assert!(matches!(e, TransferError::Invalid(_)), "{e}");
    // i64 labels need 8-byte alignment; stats need three values.
    let mut g = s.alloc(4 * 4).unwrap();
    let mut small = s.alloc(8).unwrap();
    let e = ops::softmax_cross_entropy(
        &s,
        CrossEntropyArgs {
            logits: View::from(&a),
            labels: View::new(&b, 4),
            rows: 2,
            classes: 2,
            grad: ViewMut::from(&mut g),
            grad_scale: 1.0,
            stats: ViewMut::from(&mut c),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("labels"), "{e}");
    let e = ops::softmax_cross_entropy(
        &s,
        CrossEntropyArgs {
            logits: View::from(&a),
            labels: View::from(&b),
            rows: 2,
            classes: 2,
            grad: ViewMut::from(&mut g),
            grad_scale: 1.0,
            stats: ViewMut::from(&mut small),
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, TransferError::OutOfBounds { bytes: 12, .. }),
        "{e}"
    );
    assert!(NormalizeU8::new(&s, &[0.5], &[0.0], 2, 2).is_err());
    assert!(NormalizeU8::new(&s, &[0.5, 0.5], &[0.5], 2, 2).is_err());
    assert!(CrossEntropyStats::from_slice(&[1.0, 2.0]).is_err());
    assert!(ops::available(&Device::cpu()).is_ok());
    // The stream still works after the refusals.
    assert_eq!(s.read_to_vec::<f32>(&c).unwrap().len(), 4);
}

#[test]
fn ops_wait_for_copies_and_ops_on_other_streams() {
    let dev = Device::cpu();
    let (copy, compute) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let n = 64;
    for round in 0..20 {
        // Slow the copy stream down so an unordered read would see zeros.
        copy.launch_host_fn(|| std::thread::sleep(std::time::Duration::from_millis(2)))
            .unwrap();
        let mut x = copy.alloc_zeroed(n * n * 4).unwrap();
        let data: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 + round as f32).collect();
        copy.upload_slice(
            bytemuck::cast_slice(&data),
            &mut x,
            0,
            longshore_transfer::UploadMode::Direct,
        )
        .unwrap();
        let mut eye = vec![0f32; n * n];
        for i in 0..n {
            eye[i * n + i] = 1.0;
        }
        let eye = compute.to_device(&eye).unwrap();
        let mut y = compute.alloc(n * n * 4).unwrap();
        // No explicit wait: the op orders itself after the upload on the copy stream.
        ops::gemm(
            &compute,
            GemmArgs::new(
                n,
                n,
                n,
                View::from(&x),
                View::from(&eye),
                ViewMut::from(&mut y),
            ),
        )
        .unwrap();
        // And an op writing `x` on the copy stream waits for the compute stream's read.
        let mut w = copy.alloc_zeroed(n * n * 4).unwrap();
        ops::sgd_momentum(
            &copy,
            ViewMut::from(&mut x),
            ViewMut::from(&mut w),
            View::from(&eye),
            n * n,
            Sgd {
                lr: 1.0,
                momentum: 0.0,
                weight_decay: 0.0,
            },
        )
        .unwrap();
        assert_eq!(
            compute.read_to_vec::<f32>(&y).unwrap(),
            data,
            "round {round}"
        );
    }
}
