//! The `ops` module on CUDA (cuBLAS + NVRTC kernels) agrees with the Cpu backend on the same
//! inputs. Skips with a printed reason when there is no GPU, driver, cuBLAS or NVRTC; fails
//! instead with `LONGSHORE_REQUIRE_CUDA=1`.

use longshore_ops::{
    self as ops, Activation, CrossEntropyArgs, CrossEntropyStats, GemmArgs, NormalizeU8, Sgd, View,
    ViewMut,
};
use longshore_transfer::{Device, TransferError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn cuda_or_skip(test: &str) -> Option<Device> {
    let dev = Device::cuda(0).and_then(|d| ops::available(&d).map(|()| d));
    longshore_testing::cuda_or_skip(test, dev)
}

/// Runs one of each operation on `device` with inputs drawn from `seed`, returns every output.
fn run_all(device: &Device, seed: u64) -> Vec<(String, Vec<f32>)> {
    let s = device.new_stream().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut r = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let mut out = Vec::new();
    let shapes = [
        (1, 1, 1, false, false),
        (7, 5, 3, true, false),
        (64, 256, 64, false, true),
        (33, 17, 129, true, true),
        (256, 10, 256, false, false),
    ];
    for (i, &(m, n, k, ta, tb)) in shapes.iter().enumerate() {
        // Operands at byte offsets inside bigger buffers, like tensors of a batch.
        let mut a = r(m * k + 3);
        a[..3].fill(0.0);
        let a = s.to_device(&a).unwrap();
        let b = s.to_device(&r(k * n)).unwrap();
        let mut c = s.to_device(&r(m * n + 1)).unwrap();
        let (alpha, beta) = if i % 2 == 0 { (1.0, 0.0) } else { (0.7, -0.3) };
        ops::gemm(
            &s,
            GemmArgs::new(
                m,
                n,
                k,
                View::new(&a, 12),
                View::from(&b),
                ViewMut::new(&mut c, 4),
            )
            .trans_a(ta)
            .trans_b(tb)
            .scale(alpha, beta),
        )
        .unwrap();
        out.push((
            format!("gemm {m}x{n}x{k} ta={ta} tb={tb}"),
            s.read_to_vec(&c).unwrap(),
        ));
    }
    let (rows, cols) = (300, 70);
    let mut y = s.to_device(&r(rows * cols)).unwrap();
    let bias = s.to_device(&r(cols)).unwrap();
    ops::bias_act(
        &s,
        ViewMut::from(&mut y),
        View::from(&bias),
        rows,
        cols,
        Activation::Relu,
    )
    .unwrap();
    out.push(("bias_act relu".into(), s.read_to_vec(&y).unwrap()));
    let mut y2 = s.to_device(&r(rows * cols)).unwrap();
    ops::bias_act(
        &s,
        ViewMut::from(&mut y2),
        View::from(&bias),
        rows,
        cols,
        Activation::Identity,
    )
    .unwrap();
    out.push(("bias_act identity".into(), s.read_to_vec(&y2).unwrap()));
    let mut g = s.to_device(&r(rows * cols)).unwrap();
    ops::relu_backward(&s, ViewMut::from(&mut g), View::from(&y), rows * cols).unwrap();
    out.push(("relu_backward".into(), s.read_to_vec(&g).unwrap()));
    let mut db = s.alloc(cols * 4).unwrap();
    ops::bias_grad(&s, View::from(&g), rows, cols, ViewMut::from(&mut db)).unwrap();
    out.push(("bias_grad".into(), s.read_to_vec(&db).unwrap()));

    let (n, classes) = (1000, 10);
    let logits: Vec<f32> = r(n * classes).iter().map(|v| v * 4.0).collect();
    let logits = s.to_device(&logits).unwrap();
    let labels: Vec<i64> = (0..n as i64)
        .map(|i| if i == 17 { 99 } else { (i * 7) % 10 })
        .collect();
    let labels = s.to_device(&labels).unwrap();
    let mut grad = s.alloc(n * classes * 4).unwrap();
    let mut stats = s.alloc_zeroed(CrossEntropyStats::LEN * 4).unwrap();
    ops::softmax_cross_entropy(
        &s,
        CrossEntropyArgs {
            logits: View::from(&logits),
            labels: View::from(&labels),
            rows: n,
            classes,
            grad: ViewMut::from(&mut grad),
            grad_scale: 1.0 / n as f32,
            stats: ViewMut::from(&mut stats),
        },
    )
    .unwrap();
    out.push(("softmax grad".into(), s.read_to_vec(&grad).unwrap()));
    out.push(("softmax stats".into(), s.read_to_vec(&stats).unwrap()));

    let len = 10_000;
    let mut w = s.to_device(&r(len)).unwrap();
    let mut v = s.alloc_zeroed(len * 4).unwrap();
    for _ in 0..3 {
        let gr = s.to_device(&r(len)).unwrap();
        ops::sgd_momentum(
            &s,
            ViewMut::from(&mut w),
            ViewMut::from(&mut v),
            View::from(&gr),
            len,
            Sgd {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 1e-4,
            },
        )
        .unwrap();
    }
    out.push(("sgd".into(), s.read_to_vec(&w).unwrap()));

    let norm =
        NormalizeU8::new(&s, &[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225], 31, 29).unwrap();
    let images = 5;
    let bytes: Vec<u8> = (0..images * norm.image_len() + 1)
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    let src = s.to_device(&bytes).unwrap();
    let mut dst = s.alloc(images * norm.image_len() * 4).unwrap();
    ops::normalize_u8(
        &s,
        &norm,
        View::new(&src, 1),
        ViewMut::from(&mut dst),
        images,
    )
    .unwrap();
    out.push(("normalize_u8".into(), s.read_to_vec(&dst).unwrap()));
    out
}

#[test]
fn cuda_ops_agree_with_cpu() {
    let Some(gpu) = cuda_or_skip("cuda_ops_agree_with_cpu") else {
        return;
    };
    for seed in [1, 2] {
        let want = run_all(&Device::cpu(), seed);
        let got = run_all(&gpu, seed);
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!(w.len(), g.len(), "{name}");
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                // cuBLAS may sum in another order (and use FMA): compare to float rounding.
                assert!(
                    (a - b).abs() <= 1e-3 * (1.0 + a.abs()),
                    "{name}[{i}]: cpu {a}, cuda {b}"
                );
            }
        }
    }
}

#[test]
fn cuda_ops_check_devices_and_bounds() {
    let Some(gpu) = cuda_or_skip("cuda_ops_check_devices_and_bounds") else {
        return;
    };
    let s = gpu.new_stream().unwrap();
    let cpu = Device::cpu().new_stream().unwrap();
    let a = s.alloc_zeroed(64).unwrap();
    let on_cpu = cpu.alloc_zeroed(64).unwrap();
    let mut c = s.alloc_zeroed(64).unwrap();
    let e = ops::gemm(
        &s,
        GemmArgs::new(
            2,
            2,
            2,
            View::from(&on_cpu),
            View::from(&a),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap_err();
    assert!(
        matches!(e, TransferError::DeviceMismatch { what: "A", .. }),
        "{e}"
    );
    let e = ops::gemm(
        &s,
        GemmArgs::new(
            4,
            4,
            8,
            View::from(&a),
            View::from(&a),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap_err();
    assert!(matches!(e, TransferError::OutOfBounds { .. }), "{e}");
    // A CUDA stream's ops order themselves after an upload on another CUDA stream.
    let copy = gpu.new_stream().unwrap();
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let x = copy.to_device(&data).unwrap();
    let eye: Vec<f32> = (0..16)
        .map(|i| if i % 5 == 0 { 1.0 } else { 0.0 })
        .collect();
    let eye = s.to_device(&eye).unwrap();
    ops::gemm(
        &s,
        GemmArgs::new(
            4,
            4,
            4,
            View::from(&x),
            View::from(&eye),
            ViewMut::from(&mut c),
        ),
    )
    .unwrap();
    assert_eq!(s.read_to_vec::<f32>(&c).unwrap(), data);
}
