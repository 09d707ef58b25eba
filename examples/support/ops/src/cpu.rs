//! The `Cpu` backend of the operations: jobs run on the stream's worker thread.
//!
//! A job locks the memory of every buffer it touches (in address order, so two jobs on two
//! streams never deadlock), then works on typed views of the checked regions. Regions were
//! bounds-checked on the host when the job was enqueued and buffers never change size, so the
//! slicing here cannot fail.

use std::borrow::Cow;

use longshore_transfer::{CpuMemory, CpuMemoryGuard};

use super::{Activation, Region, Sgd};

#[derive(Debug, Clone, Copy)]
pub(crate) struct GemmShape {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
}

fn addr(m: &CpuMemory) -> usize {
    m.addr()
}

/// Locks `srcs` and `dsts` in address order and calls `f` with their bytes. A buffer listed
/// as a source more than once is locked once. Returns `None` (and logs) if a destination is
/// also a source or listed twice, which the public API's borrows rule out.
fn with_mems<R>(
    srcs: &[&CpuMemory],
    dsts: &[&CpuMemory],
    f: impl FnOnce(&[&[u8]], &mut [&mut [u8]]) -> R,
) -> Option<R> {
    let mut all: Vec<&CpuMemory> = srcs.iter().chain(dsts.iter()).copied().collect();
    all.sort_by_key(|m| addr(m));
    all.dedup_by_key(|m| addr(m));
    let mut guards: Vec<(usize, CpuMemoryGuard<'_>)> =
        all.iter().map(|m| (addr(m), m.lock())).collect();
    let mut src_refs: Vec<Option<&[u8]>> = vec![None; srcs.len()];
    let mut dst_refs: Vec<Option<&mut [u8]>> = (0..dsts.len()).map(|_| None).collect();
    for (a, g) in guards.iter_mut() {
        let as_dst: Vec<usize> = (0..dsts.len()).filter(|&j| addr(dsts[j]) == *a).collect();
        let as_src = srcs.iter().any(|s| addr(s) == *a);
        match (as_dst.as_slice(), as_src) {
            ([], _) => {
                let g: &[u8] = g;
                for (i, s) in srcs.iter().enumerate() {
                    if addr(s) == *a {
                        src_refs[i] = Some(g);
                    }
                }
            }
            ([j], false) => dst_refs[*j] = Some(&mut **g),
            _ => {
                tracing::error!(target: "longshore_ops", "an op's output aliases another of its buffers; skipped");
                return None;
            }
        }
    }
    let src: Vec<&[u8]> = src_refs.into_iter().collect::<Option<_>>()?;
    let mut dst: Vec<&mut [u8]> = dst_refs.into_iter().collect::<Option<_>>()?;
    Some(f(&src, &mut dst))
}

fn region(bytes: &[u8], r: Region) -> &[u8] {
    &bytes[r.offset..r.offset + r.bytes]
}

fn region_mut(bytes: &mut [u8], r: Region) -> &mut [u8] {
    &mut bytes[r.offset..r.offset + r.bytes]
}

/// Typed view of bytes, copied only if they are not aligned for `T`.
fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// Runs `f` on a mutable f32 view of `bytes` (through a copy if they are not aligned).
fn with_f32_mut<R>(bytes: &mut [u8], f: impl FnOnce(&mut [f32]) -> R) -> R {
    match bytemuck::try_cast_slice_mut::<u8, f32>(bytes) {
        Ok(s) => f(s),
        Err(_) => {
            let mut v: Vec<f32> = bytemuck::pod_collect_to_vec(bytes);
            let r = f(&mut v);
            bytes.copy_from_slice(bytemuck::cast_slice(&v));
            r
        }
    }
}

pub(crate) fn gemm(
    s: GemmShape,
    a: &CpuMemory,
    ra: Region,
    b: &CpuMemory,
    rb: Region,
    c: &CpuMemory,
    rc: Region,
) {
    with_mems(&[a, b], &[c], |src, dst| {
        let av = typed::<f32>(region(src[0], ra));
        let bv = typed::<f32>(region(src[1], rb));
        with_f32_mut(region_mut(dst[0], rc), |cv| {
            let (m, n, k) = (s.m, s.n, s.k);
            // Row-major strides; a transposed operand is stored the other way round.
            let (rsa, csa) = if s.trans_a { (1, m) } else { (k, 1) };
            let (rsb, csb) = if s.trans_b { (1, k) } else { (n, 1) };
            debug_assert!(av.len() == m * k && bv.len() == k * n && cv.len() == m * n);
            // SAFETY: `av` holds m*k values, `bv` k*n, `cv` m*n (the regions were checked on the
            // host for exactly these sizes); with the strides above every index sgemm forms,
            // i*rs + j*cs for i < rows and j < cols, is below those lengths. `cv` is a unique
            // borrow, distinct from the inputs (separate allocations), with non-aliasing
            // strides (n, 1).
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    s.alpha,
                    av.as_ptr(),
                    rsa as isize,
                    csa as isize,
                    bv.as_ptr(),
                    rsb as isize,
                    csb as isize,
                    s.beta,
                    cv.as_mut_ptr(),
                    n as isize,
                    1,
                )
            }
        })
    });
}

pub(crate) fn bias_act(
    y: &CpuMemory,
    ry: Region,
    b: &CpuMemory,
    rb: Region,
    cols: usize,
    act: Activation,
) {
    with_mems(&[b], &[y], |src, dst| {
        let bias = typed::<f32>(region(src[0], rb));
        with_f32_mut(region_mut(dst[0], ry), |y| {
            for row in y.chunks_exact_mut(cols) {
                for (v, b) in row.iter_mut().zip(bias.iter()) {
                    let x = *v + b;
                    *v = match act {
                        Activation::Identity => x,
                        Activation::Relu => x.max(0.0),
                    };
                }
            }
        })
    });
}

pub(crate) fn relu_backward(g: &CpuMemory, rg: Region, o: &CpuMemory, ro: Region) {
    with_mems(&[o], &[g], |src, dst| {
        let out = typed::<f32>(region(src[0], ro));
        with_f32_mut(region_mut(dst[0], rg), |g| {
            for (g, o) in g.iter_mut().zip(out.iter()) {
                // Also blocks the gradient at a NaN output, as the CUDA kernel does.
                if o.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                    *g = 0.0;
                }
            }
        })
    });
}

pub(crate) fn bias_grad(dy: &CpuMemory, ry: Region, db: &CpuMemory, rb: Region, cols: usize) {
    with_mems(&[dy], &[db], |src, dst| {
        let dy = typed::<f32>(region(src[0], ry));
        with_f32_mut(region_mut(dst[0], rb), |db| {
            db.fill(0.0);
            for row in dy.chunks_exact(cols) {
                for (d, v) in db.iter_mut().zip(row) {
                    *d += v;
                }
            }
        })
    });
}

pub(crate) fn softmax_xent(
    logits: (&CpuMemory, Region),
    labels: (&CpuMemory, Region),
    grad: (&CpuMemory, Region),
    stats: (&CpuMemory, Region),
    classes: usize,
    grad_scale: f32,
) {
    with_mems(&[logits.0, labels.0], &[grad.0, stats.0], |src, dst| {
        let z = typed::<f32>(region(src[0], logits.1));
        let y = typed::<i64>(region(src[1], labels.1));
        let [g_bytes, s_bytes] = dst else { return };
        let (mut loss_sum, mut correct, mut invalid) = (0f32, 0f32, 0f32);
        with_f32_mut(region_mut(g_bytes, grad.1), |g| {
            for ((z, g), &label) in z
                .chunks_exact(classes)
                .zip(g.chunks_exact_mut(classes))
                .zip(y.iter())
            {
                let (loss, hit) = xent_row(z, label, g, grad_scale);
                match loss {
                    Some(l) => {
                        loss_sum += l;
                        correct += f32::from(u8::from(hit));
                    }
                    None => invalid += 1.0,
                }
            }
        });
        with_f32_mut(region_mut(s_bytes, stats.1), |s| {
            s[0] += loss_sum;
            s[1] += correct;
            s[2] += invalid;
        });
    });
}

/// One row of softmax cross-entropy: writes the gradient, returns the loss (None for an
/// invalid label) and whether the arg-max is the label. Same arithmetic as the CUDA kernel.
fn xent_row(z: &[f32], label: i64, g: &mut [f32], scale: f32) -> (Option<f32>, bool) {
    let (mut max, mut arg) = (z[0], 0usize);
    for (c, &v) in z.iter().enumerate().skip(1) {
        if v > max {
            max = v;
            arg = c;
        }
    }
    let label = match usize::try_from(label) {
        Ok(l) if l < z.len() => l,
        _ => {
            g.fill(0.0);
            return (None, false);
        }
    };
    let sum: f32 = z.iter().map(|v| (v - max).exp()).sum();
    for (c, (g, v)) in g.iter_mut().zip(z).enumerate() {
        let p = (v - max).exp() / sum;
        *g = (p - if c == label { 1.0 } else { 0.0 }) * scale;
    }
    (Some(sum.ln() + max - z[label]), arg == label)
}

pub(crate) fn sgd(
    p: &CpuMemory,
    rp: Region,
    v: &CpuMemory,
    rv: Region,
    g: &CpuMemory,
    rg: Region,
    sgd: Sgd,
) {
    with_mems(&[g], &[p, v], |src, dst| {
        let grad = typed::<f32>(region(src[0], rg));
        let [p_bytes, v_bytes] = dst else { return };
        with_f32_mut(region_mut(p_bytes, rp), |p| {
            with_f32_mut(region_mut(v_bytes, rv), |v| {
                for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(grad.iter()) {
                    let g = g + sgd.weight_decay * *p;
                    *v = sgd.momentum * *v + g;
                    *p -= sgd.lr * *v;
                }
            })
        })
    });
}

pub(crate) fn scale(x: &CpuMemory, rx: Region, alpha: f32) {
    with_mems(&[], &[x], |_, dst| {
        with_f32_mut(region_mut(dst[0], rx), |x| {
            x.iter_mut().for_each(|v| *v *= alpha)
        })
    });
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize_u8(
    s: &CpuMemory,
    rs: Region,
    d: &CpuMemory,
    rd: Region,
    params: &CpuMemory,
    rp: Region,
    channels: usize,
    hw: usize,
) {
    with_mems(&[s, params], &[d], |src, dst| {
        let input = region(src[0], rs);
        let prm = typed::<f32>(region(src[1], rp));
        let (scale, bias) = prm.split_at(channels);
        with_f32_mut(region_mut(dst[0], rd), |out| {
            for (plane, (o, x)) in out
                .chunks_exact_mut(hw)
                .zip(input.chunks_exact(hw))
                .enumerate()
            {
                let c = plane % channels;
                let (sc, b) = (scale[c], bias[c]);
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f32::from(x) * sc + b;
                }
            }
        })
    });
}
