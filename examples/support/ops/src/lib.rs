//! longshore-ops is a small set of safe f32 operations on longshore [`DeviceBuffer`]s,
//! enqueued on a [`Stream`]: enough to train a small model on the batches a loader delivers,
//! on either backend, with one code path.
//!
//! It is a support crate of longshore's example training binaries (`examples/`), not part of
//! the library and not published: real models use candle, burn or PyTorch over
//! `DeviceBatch::cuda_ptr` or DLPack.
//!
//! ```
//! use longshore_transfer::Device;
//! use longshore_ops::{self as ops, Activation, GemmArgs, View, ViewMut};
//!
//! let stream = Device::cpu().new_stream()?;
//! // Row-major: x is 2 x 3, w is 3 x 2, bias has 2 entries.
//! let x = stream.to_device(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let w = stream.to_device(&[1.0f32, 0.0, 0.0, 1.0, 1.0, -1.0])?;
//! let b = stream.to_device(&[0.5f32, 0.5])?;
//! let mut y = stream.alloc(2 * 2 * 4)?;
//! ops::gemm(&stream, GemmArgs::new(2, 2, 3, View::from(&x), View::from(&w), ViewMut::from(&mut y)))?;
//! ops::bias_act(&stream, ViewMut::from(&mut y), View::from(&b), 2, 2, Activation::Relu)?;
//! assert_eq!(stream.read_to_vec::<f32>(&y)?, vec![4.5, 0.0, 10.5, 0.0]);
//! # Ok::<(), longshore_transfer::TransferError>(())
//! ```
//!
//! # What there is
//!
//! * [`gemm`]: `C = alpha * op(A) * op(B) + beta * C`, row-major, with transposes and byte
//!   offsets ([`View`], [`ViewMut`]), so a tensor inside a loader's batch is used in place.
//! * [`bias_act`], [`relu_backward`], [`bias_grad`]: a dense layer's bias, ReLU and their
//!   gradients.
//! * [`softmax_cross_entropy`]: loss, gradient, and per-batch loss sum and correct count
//!   accumulated into a small device buffer ([`CrossEntropyStats`]), so a training loop reads
//!   the device only once per epoch.
//! * [`scale`]: `x *= alpha` in place.
//! * [`sgd_momentum`]: PyTorch's `SGD(momentum, weight_decay)` update.
//! * [`normalize_u8`] with [`NormalizeU8`]: `u8` CHW images to normalised `f32` on the device.
//!
//! # Backends
//!
//! On `Cpu` each operation is a job on the stream's worker thread (the product through
//! `matrixmultiply`'s sgemm, the rest plain loops). On CUDA the product is `cublasSgemm` on a
//! cuBLAS handle bound to the stream, and the rest are kernels compiled once per process with
//! NVRTC and loaded once per device. cuBLAS and NVRTC are loaded at run time (found by
//! transfer's [`cuda_libs`](longshore_transfer::cuda_libs) from this crate's [`CUBLAS`] spec
//! and transfer's `NVRTC`); [`available`] says whether they can be. Results agree across backends to float rounding.
//!
//! # Safety and ordering
//!
//! Every size, offset and alignment is checked on the host against the buffers' lengths before
//! anything is enqueued, so a kernel never touches memory outside its buffers; a mistake is a
//! [`TransferError`], never undefined behaviour. Outputs are `&mut` borrows, so an output can
//! never alias an input. Operations take part in the buffers' cross-stream tracking like
//! copies do: a read waits for the buffer's last write on another stream, a write waits for
//! earlier reads and writes on other streams.
//!
//! # Built on transfer's public seams
//!
//! This crate reaches longshore-transfer only through its public API, as any crate above it
//! can: [`Stream::enqueue_work`] orders each operation after the buffers' earlier uses and
//! records it as their latest use (so a buffer is freed only after the operation), the CUDA
//! path launches on [`Stream::as_raw`]'s `CUstream` with [`DeviceBuffer::cuda_device_ptr`]s and
//! keeps its cuBLAS handle in [`Stream::local`], and the `Cpu` path runs jobs on the stream's
//! executor thread ([`Stream::launch_host_fn`]) over [`DeviceBuffer::cpu_memory`].
//! Errors are longshore-transfer's [`TransferError`].

// Unsafe code only in the two backend modules: the raw-pointer sgemm of matrixmultiply and
// the cuBLAS / kernel launches, each block with its SAFETY comment.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod cpu;
#[allow(unsafe_code)]
mod cuda;
#[allow(unsafe_code)]
mod ffi;

pub use ffi::CUBLAS;
use longshore_transfer::{
    CpuMemory, Device, DeviceBuffer, DeviceId, Result, Stream, TransferError,
};

/// A read-only region of a device buffer: the buffer and a byte offset into it. How many
/// elements it covers is given by the operation's sizes.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    buf: &'a DeviceBuffer,
    offset: usize,
}

impl<'a> View<'a> {
    /// The region of `buf` starting `offset` bytes in.
    pub fn new(buf: &'a DeviceBuffer, offset: usize) -> Self {
        Self { buf, offset }
    }

    /// The buffer.
    pub fn buffer(&self) -> &'a DeviceBuffer {
        self.buf
    }

    /// The byte offset.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl<'a> From<&'a DeviceBuffer> for View<'a> {
    fn from(buf: &'a DeviceBuffer) -> Self {
        Self::new(buf, 0)
    }
}

/// A writable region of a device buffer: the buffer and a byte offset into it.
#[derive(Debug)]
pub struct ViewMut<'a> {
    buf: &'a mut DeviceBuffer,
    offset: usize,
}

impl<'a> ViewMut<'a> {
    /// The region of `buf` starting `offset` bytes in.
    pub fn new(buf: &'a mut DeviceBuffer, offset: usize) -> Self {
        Self { buf, offset }
    }

    /// The buffer (shared: the `&mut` borrow held by the view is what keeps others out).
    pub fn buffer(&self) -> &DeviceBuffer {
        self.buf
    }

    /// The byte offset.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl<'a> From<&'a mut DeviceBuffer> for ViewMut<'a> {
    fn from(buf: &'a mut DeviceBuffer) -> Self {
        Self::new(buf, 0)
    }
}

/// Arguments of [`gemm`]: `C = alpha * op(A) * op(B) + beta * C` on row-major matrices.
///
/// `op(A)` is `m x k`, `op(B)` is `k x n`, `C` is `m x n`, all dense (leading dimension =
/// number of columns as stored). With `trans_a`, `A` is stored as `k x m` and used
/// transposed; likewise `trans_b` (`B` stored `n x k`). With `beta == 0`, `C` is not read.
#[derive(Debug)]
pub struct GemmArgs<'a> {
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// Columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the old `C`.
    pub beta: f32,
    /// `A` (f32).
    pub a: View<'a>,
    /// Use `A` transposed.
    pub trans_a: bool,
    /// `B` (f32).
    pub b: View<'a>,
    /// Use `B` transposed.
    pub trans_b: bool,
    /// `C` (f32), written.
    pub c: ViewMut<'a>,
}

impl<'a> GemmArgs<'a> {
    /// `C = A * B` (`alpha` 1, `beta` 0, no transposes).
    pub fn new(m: usize, n: usize, k: usize, a: View<'a>, b: View<'a>, c: ViewMut<'a>) -> Self {
        Self {
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
            a,
            trans_a: false,
            b,
            trans_b: false,
            c,
        }
    }

    /// Uses `A` transposed (stored `k x m`).
    pub fn trans_a(mut self, t: bool) -> Self {
        self.trans_a = t;
        self
    }

    /// Uses `B` transposed (stored `n x k`).
    pub fn trans_b(mut self, t: bool) -> Self {
        self.trans_b = t;
        self
    }

    /// Sets `alpha` and `beta`.
    pub fn scale(mut self, alpha: f32, beta: f32) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }
}

/// The activation applied by [`bias_act`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// None: `y + b`.
    Identity,
    /// `max(y + b, 0)`.
    Relu,
}

/// Arguments of [`softmax_cross_entropy`].
#[derive(Debug)]
pub struct CrossEntropyArgs<'a> {
    /// Logits, `rows x classes` f32.
    pub logits: View<'a>,
    /// Class labels, `rows` i64 (8-byte aligned offset).
    pub labels: View<'a>,
    /// Rows (samples).
    pub rows: usize,
    /// Classes.
    pub classes: usize,
    /// Written: `(softmax(logits) - onehot(label)) * grad_scale`, `rows x classes` f32.
    pub grad: ViewMut<'a>,
    /// Scale of the gradient; `1 / rows` for the mean loss.
    pub grad_scale: f32,
    /// Accumulated into (added to, not overwritten): [`CrossEntropyStats::LEN`] f32 values,
    /// see [`CrossEntropyStats`]. Zero it (e.g. [`Stream::memset`]) to start a new sum.
    pub stats: ViewMut<'a>,
}

/// What [`softmax_cross_entropy`] accumulates in its stats buffer, read back with
/// [`from_slice`](CrossEntropyStats::from_slice).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CrossEntropyStats {
    /// Sum over rows of `-log softmax(logits)[label]`.
    pub loss_sum: f64,
    /// Rows whose arg-max logit is the label.
    pub correct: u64,
    /// Rows whose label was outside `0..classes`: no loss, zero gradient.
    pub invalid_labels: u64,
}

impl CrossEntropyStats {
    /// Number of f32 values in the stats buffer: loss sum, correct count, invalid labels.
    pub const LEN: usize = 3;

    /// Reads the stats from the buffer's f32 values (e.g. from [`Stream::read_to_vec`]).
    pub fn from_slice(values: &[f32]) -> Result<Self> {
        match values {
            [loss, correct, invalid, ..] => Ok(Self {
                loss_sum: f64::from(*loss),
                correct: *correct as u64,
                invalid_labels: *invalid as u64,
            }),
            _ => Err(TransferError::Invalid(format!(
                "cross-entropy stats need {} values, got {}",
                Self::LEN,
                values.len()
            ))),
        }
    }
}

/// Hyper-parameters of [`sgd_momentum`] (PyTorch's `torch.optim.SGD`, dampening 0, not
/// Nesterov).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0 for plain SGD).
    pub momentum: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

/// Per-channel normalisation of `u8` CHW images on a device, like torchvision's
/// `ToTensor()` then `Normalize(mean, std)`: `out = (x / 255 - mean[c]) / std[c]`. Holds its
/// constants in a small device buffer; build it once, use it for every batch.
#[derive(Debug)]
pub struct NormalizeU8 {
    channels: usize,
    height: usize,
    width: usize,
    /// `scale[0..C]` then `bias[0..C]`.
    params: DeviceBuffer,
}

impl NormalizeU8 {
    /// Normalisation of `channels x height x width` images (`channels = mean.len()`) with
    /// per-channel `mean` and `std` on the `[0, 1]` scale; the constants are uploaded on
    /// `stream`.
    pub fn new(
        stream: &Stream,
        mean: &[f32],
        std: &[f32],
        height: usize,
        width: usize,
    ) -> Result<Self> {
        if mean.is_empty() || mean.len() != std.len() {
            return Err(TransferError::Invalid(format!(
                "normalize_u8: {} means and {} stds; need one of each per channel",
                mean.len(),
                std.len()
            )));
        }
        if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(TransferError::Invalid(format!(
                "normalize_u8: std {s} is not a positive finite number"
            )));
        }
        if height == 0 || width == 0 {
            return Err(TransferError::Invalid(format!(
                "normalize_u8: empty {height}x{width} images"
            )));
        }
        let mut params: Vec<f32> = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
        params.extend(mean.iter().zip(std).map(|(m, s)| -m / s));
        Ok(Self {
            channels: mean.len(),
            height,
            width,
            params: stream.to_device(&params)?,
        })
    }

    /// Channels per image.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Elements per image (`channels * height * width`).
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }
}

/// Whether the operations can run on `device`: always on `Cpu`; on CUDA when cuBLAS and NVRTC
/// load (the kernels are compiled and loaded here, once, so later calls only launch).
pub fn available(device: &Device) -> Result<()> {
    match device.id() {
        DeviceId::Cpu => Ok(()),
        DeviceId::Cuda(_) => cuda::prepare(device),
    }
}

// ---------------------------------------------------------------------------------------------
// Checks.

/// A checked region: `elems` elements of `size` bytes at a byte offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
}

pub(crate) fn check(
    op: &'static str,
    what: &'static str,
    stream: &Stream,
    buf: &DeviceBuffer,
    offset: usize,
    elems: usize,
    size: usize,
) -> Result<Region> {
    let expected = stream.device().id();
    let found = buf.device().id();
    if expected != found {
        return Err(TransferError::DeviceMismatch {
            op,
            what,
            expected,
            found,
        });
    }
    if !offset.is_multiple_of(size) {
        return Err(TransferError::Invalid(format!(
            "{op}: {what} starts at byte offset {offset}, which is not a multiple of its \
             {size}-byte element"
        )));
    }
    let bytes = elems.checked_mul(size);
    match bytes.and_then(|b| offset.checked_add(b).map(|end| (b, end))) {
        Some((bytes, end)) if end <= buf.len() => Ok(Region { offset, bytes }),
        _ => Err(TransferError::OutOfBounds {
            op,
            bytes: bytes.unwrap_or(usize::MAX),
            offset,
            capacity: buf.len(),
        }),
    }
}

pub(crate) fn nonzero(op: &'static str, dims: &[(&str, usize)]) -> Result<()> {
    for (name, v) in dims {
        if *v == 0 {
            return Err(TransferError::Invalid(format!("{op}: {name} is 0")));
        }
    }
    Ok(())
}

fn product(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| TransferError::Invalid(format!("{op}: {a} x {b} elements overflow")))
}

pub(crate) fn cpu_mem(buf: &DeviceBuffer) -> Result<CpuMemory> {
    buf.cpu_memory().ok_or_else(|| {
        TransferError::Invalid(format!(
            "a buffer of {} reached the cpu backend",
            buf.device().id()
        ))
    })
}

pub(crate) fn cuda_ptr(buf: &DeviceBuffer, r: Region) -> Result<u64> {
    buf.cuda_device_ptr()
        .map(|p| p + r.offset as u64)
        .ok_or_else(|| {
            TransferError::Invalid(format!(
                "a buffer of {} reached the cuda backend",
                buf.device().id()
            ))
        })
}

/// Orders an operation after the buffers' earlier uses on other streams, runs `enqueue`, and
/// records the operation as their latest use (transfer's [`Stream::enqueue_work`]).
pub(crate) fn tracked(
    stream: &Stream,
    reads: &[&DeviceBuffer],
    writes: &[&DeviceBuffer],
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<()> {
    stream.enqueue_work(reads, writes, enqueue).map(drop)
}

// ---------------------------------------------------------------------------------------------
// Operations.

/// Enqueues `C = alpha * op(A) * op(B) + beta * C` (see [`GemmArgs`]) on `stream`.
pub fn gemm(stream: &Stream, args: GemmArgs<'_>) -> Result<()> {
    const OP: &str = "gemm";
    let GemmArgs {
        m,
        n,
        k,
        alpha,
        beta,
        a,
        trans_a,
        b,
        trans_b,
        c,
    } = args;
    nonzero(OP, &[("m", m), ("n", n), ("k", k)])?;
    let ra = check(OP, "A", stream, a.buf, a.offset, product(OP, m, k)?, 4)?;
    let rb = check(OP, "B", stream, b.buf, b.offset, product(OP, k, n)?, 4)?;
    let rc = check(OP, "C", stream, c.buf, c.offset, product(OP, m, n)?, 4)?;
    let shape = cpu::GemmShape {
        m,
        n,
        k,
        alpha,
        beta,
        trans_a,
        trans_b,
    };
    let c_buf: &DeviceBuffer = c.buf;
    tracked(stream, &[a.buf, b.buf], &[c_buf], || {
        match stream.device().id() {
            DeviceId::Cpu => {
                let (ma, mb, mc) = (cpu_mem(a.buf)?, cpu_mem(b.buf)?, cpu_mem(c_buf)?);
                stream.launch_host_fn(move || cpu::gemm(shape, &ma, ra, &mb, rb, &mc, rc))
            }
            DeviceId::Cuda(_) => cuda::gemm(
                stream,
                shape,
                cuda_ptr(a.buf, ra)?,
                cuda_ptr(b.buf, rb)?,
                cuda_ptr(c_buf, rc)?,
            ),
        }
    })
}

/// Enqueues `y[r, c] = act(y[r, c] + bias[c])` over a `rows x cols` f32 matrix, in place.
pub fn bias_act(
    stream: &Stream,
    y: ViewMut<'_>,
    bias: View<'_>,
    rows: usize,
    cols: usize,
    act: Activation,
) -> Result<()> {
    const OP: &str = "bias_act";
    nonzero(OP, &[("rows", rows), ("cols", cols)])?;
    let ry = check(
        OP,
        "y",
        stream,
        y.buf,
        y.offset,
        product(OP, rows, cols)?,
        4,
    )?;
    let rb = check(OP, "bias", stream, bias.buf, bias.offset, cols, 4)?;
    let y_buf: &DeviceBuffer = y.buf;
    tracked(stream, &[bias.buf], &[y_buf], || {
        match stream.device().id() {
            DeviceId::Cpu => {
                let (my, mb) = (cpu_mem(y_buf)?, cpu_mem(bias.buf)?);
                stream.launch_host_fn(move || cpu::bias_act(&my, ry, &mb, rb, cols, act))
            }
            DeviceId::Cuda(_) => cuda::bias_act(
                stream,
                cuda_ptr(y_buf, ry)?,
                cuda_ptr(bias.buf, rb)?,
                rows,
                cols,
                act,
            ),
        }
    })
}

/// Enqueues the ReLU backward mask: `grad[i] = 0` where `output[i] <= 0` (the layer's ReLU
/// output), over `len` f32 values, in place.
pub fn relu_backward(
    stream: &Stream,
    grad: ViewMut<'_>,
    output: View<'_>,
    len: usize,
) -> Result<()> {
    const OP: &str = "relu_backward";
    nonzero(OP, &[("len", len)])?;
    let rg = check(OP, "grad", stream, grad.buf, grad.offset, len, 4)?;
    let ro = check(OP, "output", stream, output.buf, output.offset, len, 4)?;
    let g_buf: &DeviceBuffer = grad.buf;
    tracked(stream, &[output.buf], &[g_buf], || {
        match stream.device().id() {
            DeviceId::Cpu => {
                let (mg, mo) = (cpu_mem(g_buf)?, cpu_mem(output.buf)?);
                stream.launch_host_fn(move || cpu::relu_backward(&mg, rg, &mo, ro))
            }
            DeviceId::Cuda(_) => {
                cuda::relu_backward(stream, cuda_ptr(g_buf, rg)?, cuda_ptr(output.buf, ro)?, len)
            }
        }
    })
}

/// Enqueues the bias gradient: `db[c] = sum over r of dy[r, c]` for a `rows x cols` f32
/// matrix `dy` (`db` is overwritten).
pub fn bias_grad(
    stream: &Stream,
    dy: View<'_>,
    rows: usize,
    cols: usize,
    db: ViewMut<'_>,
) -> Result<()> {
    const OP: &str = "bias_grad";
    nonzero(OP, &[("rows", rows), ("cols", cols)])?;
    let ry = check(
        OP,
        "dy",
        stream,
        dy.buf,
        dy.offset,
        product(OP, rows, cols)?,
        4,
    )?;
    let rb = check(OP, "db", stream, db.buf, db.offset, cols, 4)?;
    let db_buf: &DeviceBuffer = db.buf;
    tracked(stream, &[dy.buf], &[db_buf], || {
        match stream.device().id() {
            DeviceId::Cpu => {
                let (my, mb) = (cpu_mem(dy.buf)?, cpu_mem(db_buf)?);
                stream.launch_host_fn(move || cpu::bias_grad(&my, ry, &mb, rb, cols))
            }
            DeviceId::Cuda(_) => cuda::bias_grad(
                stream,
                cuda_ptr(dy.buf, ry)?,
                cuda_ptr(db_buf, rb)?,
                rows,
                cols,
            ),
        }
    })
}

/// Enqueues softmax cross-entropy from i64 labels: writes the gradient with respect to the
/// logits and adds the batch's loss sum, correct count and invalid-label count to the stats
/// buffer (see [`CrossEntropyArgs`]).
pub fn softmax_cross_entropy(stream: &Stream, args: CrossEntropyArgs<'_>) -> Result<()> {
    const OP: &str = "softmax_cross_entropy";
    let CrossEntropyArgs {
        logits,
        labels,
        rows,
        classes,
        grad,
        grad_scale,
        stats,
    } = args;
    nonzero(OP, &[("rows", rows), ("classes", classes)])?;
    let n = product(OP, rows, classes)?;
    let rl = check(OP, "logits", stream, logits.buf, logits.offset, n, 4)?;
    let ry = check(OP, "labels", stream, labels.buf, labels.offset, rows, 8)?;
    let rg = check(OP, "grad", stream, grad.buf, grad.offset, n, 4)?;
    let rs = check(
        OP,
        "stats",
        stream,
        stats.buf,
        stats.offset,
        CrossEntropyStats::LEN,
        4,
    )?;
    let (g_buf, s_buf): (&DeviceBuffer, &DeviceBuffer) = (grad.buf, stats.buf);
    tracked(
        stream,
        &[logits.buf, labels.buf],
        &[g_buf, s_buf],
        || match stream.device().id() {
            DeviceId::Cpu => {
                let mems = (
                    cpu_mem(logits.buf)?,
                    cpu_mem(labels.buf)?,
                    cpu_mem(g_buf)?,
                    cpu_mem(s_buf)?,
                );
                stream.launch_host_fn(move || {
                    cpu::softmax_xent(
                        (&mems.0, rl),
                        (&mems.1, ry),
                        (&mems.2, rg),
                        (&mems.3, rs),
                        classes,
                        grad_scale,
                    )
                })
            }
            DeviceId::Cuda(_) => cuda::softmax_xent(
                stream,
                [
                    cuda_ptr(logits.buf, rl)?,
                    cuda_ptr(labels.buf, ry)?,
                    cuda_ptr(g_buf, rg)?,
                    cuda_ptr(s_buf, rs)?,
                ],
                rows,
                classes,
                grad_scale,
            ),
        },
    )
}

/// Enqueues one SGD-with-momentum step over `len` f32 parameters:
/// `g' = grad + weight_decay * param; velocity = momentum * velocity + g';
/// param -= lr * velocity` (PyTorch's update; start with a zeroed `velocity`).
pub fn sgd_momentum(
    stream: &Stream,
    param: ViewMut<'_>,
    velocity: ViewMut<'_>,
    grad: View<'_>,
    len: usize,
    sgd: Sgd,
) -> Result<()> {
    const OP: &str = "sgd_momentum";
    nonzero(OP, &[("len", len)])?;
    let rp = check(OP, "param", stream, param.buf, param.offset, len, 4)?;
    let rv = check(
        OP,
        "velocity",
        stream,
        velocity.buf,
        velocity.offset,
        len,
        4,
    )?;
    let rg = check(OP, "grad", stream, grad.buf, grad.offset, len, 4)?;
    let (p_buf, v_buf): (&DeviceBuffer, &DeviceBuffer) = (param.buf, velocity.buf);
    tracked(stream, &[grad.buf], &[p_buf, v_buf], || {
        match stream.device().id() {
            DeviceId::Cpu => {
                let (mp, mv, mg) = (cpu_mem(p_buf)?, cpu_mem(v_buf)?, cpu_mem(grad.buf)?);
                stream.launch_host_fn(move || cpu::sgd(&mp, rp, &mv, rv, &mg, rg, sgd))
            }
            DeviceId::Cuda(_) => cuda::sgd(
                stream,
                [
                    cuda_ptr(p_buf, rp)?,
                    cuda_ptr(v_buf, rv)?,
                    cuda_ptr(grad.buf, rg)?,
                ],
                len,
                sgd,
            ),
        }
    })
}

/// Enqueues `x[i] *= alpha` over `len` f32 values, in place (e.g. the `1 / world_size` of a
/// gradient average after an all-reduce sum).
pub fn scale(stream: &Stream, x: ViewMut<'_>, len: usize, alpha: f32) -> Result<()> {
    const OP: &str = "scale";
    nonzero(OP, &[("len", len)])?;
    let rx = check(OP, "x", stream, x.buf, x.offset, len, 4)?;
    let x_buf: &DeviceBuffer = x.buf;
    tracked(stream, &[], &[x_buf], || match stream.device().id() {
        DeviceId::Cpu => {
            let mx = cpu_mem(x_buf)?;
            stream.launch_host_fn(move || cpu::scale(&mx, rx, alpha))
        }
        DeviceId::Cuda(_) => cuda::scale(stream, cuda_ptr(x_buf, rx)?, len, alpha),
    })
}

/// Enqueues the normalisation of `images` u8 CHW images from `src` into f32 `dst` (see
/// [`NormalizeU8`]).
pub fn normalize_u8(
    stream: &Stream,
    norm: &NormalizeU8,
    src: View<'_>,
    dst: ViewMut<'_>,
    images: usize,
) -> Result<()> {
    const OP: &str = "normalize_u8";
    nonzero(OP, &[("images", images)])?;
    let n = product(OP, images, norm.image_len())?;
    let rs = check(OP, "src", stream, src.buf, src.offset, n, 1)?;
    let rd = check(OP, "dst", stream, dst.buf, dst.offset, n, 4)?;
    let rp = check(
        OP,
        "the constants",
        stream,
        &norm.params,
        0,
        2 * norm.channels,
        4,
    )?;
    let hw = norm.height * norm.width;
    let channels = norm.channels;
    let d_buf: &DeviceBuffer = dst.buf;
    tracked(
        stream,
        &[src.buf, &norm.params],
        &[d_buf],
        || match stream.device().id() {
            DeviceId::Cpu => {
                let (ms, md, mp) = (cpu_mem(src.buf)?, cpu_mem(d_buf)?, cpu_mem(&norm.params)?);
                stream.launch_host_fn(move || {
                    cpu::normalize_u8(&ms, rs, &md, rd, &mp, rp, channels, hw)
                })
            }
            DeviceId::Cuda(_) => cuda::normalize_u8(
                stream,
                [
                    cuda_ptr(d_buf, rd)?,
                    cuda_ptr(src.buf, rs)?,
                    cuda_ptr(&norm.params, rp)?,
                ],
                n,
                channels,
                hw,
            ),
        },
    )
}
