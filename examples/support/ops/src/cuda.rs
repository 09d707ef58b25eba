//! The CUDA backend of the operations: cuBLAS for the product, NVRTC-compiled kernels for the
//! rest.
//!
//! cuBLAS and NVRTC are loaded at run time; their presence is checked (with any loader panic
//! contained) before the first call into either, so a missing library is an error. The kernel
//! source is compiled to PTX once per process and loaded once per device; each stream gets its
//! own cuBLAS handle, bound to it for its lifetime (a handle's workspace must not be shared by
//! kernels running concurrently on two streams).
//!
//! Every pointer handed to a kernel or to cuBLAS was computed from a region checked on the host
//! against its buffer's length (see `super::check`), for exactly the element counts passed as
//! the kernel's size arguments; the kernels index only below those sizes. That is what makes
//! each launch below sound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use longshore_transfer::{Device, DeviceId, Result, Stream, TransferError};

use super::cpu::GemmShape;
use super::ffi::{self, Blas};
use super::{Activation, Sgd};

/// Per-stream state, kept with the stream ([`Stream::local`]): a cudarc view of the stream's
/// `CUstream` (borrowed: transfer owns the stream) and its cuBLAS handle, made on first use.
/// Dropped with the stream, before transfer destroys the `CUstream`.
struct OpsStream {
    stream: Arc<CudaStream>,
    blas: Mutex<Option<Arc<Mutex<Blas>>>>,
}

fn driver_err(call: &'static str, e: DriverError, ordinal: usize, what: String) -> TransferError {
    TransferError::Cuda {
        call,
        code: format!("{:?}", e.0),
        device: DeviceId::Cuda(ordinal),
        what,
    }
}

/// The primary context of GPU `ordinal`, retained once per process (the same `CUcontext`
/// longshore-transfer uses: a primary context is one per device).
fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(c) = map.get(&ordinal) {
        return Ok(c.clone());
    }
    // Reached only with a CUDA stream or device in hand, so the driver has loaded.
    let ctx = CudaContext::new(ordinal).map_err(|e| {
        driver_err(
            "cuDevicePrimaryCtxRetain",
            e,
            ordinal,
            "opening the context for ops".into(),
        )
    })?;
    // SAFETY: this crate never uses cudarc's CudaSlice, the only user of event tracking; all
    // ordering goes through transfer's events.
    unsafe { ctx.disable_event_tracking() };
    map.insert(ordinal, ctx.clone());
    Ok(ctx)
}

const KERNELS: &str = r#"
typedef unsigned long long u64;
#define GRID_LOOP(i, n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void ls_bias_act(float* y, const float* b, u64 rows, u64 cols, int relu) {
    GRID_LOOP(i, rows * cols) {
        float v = y[i] + b[i % cols];
        y[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

extern "C" __global__ void ls_relu_backward(float* g, const float* out, u64 n) {
    GRID_LOOP(i, n) {
        if (!(out[i] > 0.0f)) g[i] = 0.0f;
    }
}

extern "C" __global__ void ls_bias_grad(float* db, const float* dy, u64 rows, u64 cols) {
    GRID_LOOP(j, cols) {
        float s = 0.0f;
        for (u64 r = 0; r < rows; ++r) s += dy[r * cols + j];
        db[j] = s;
    }
}

extern "C" __global__ void ls_softmax_xent(const float* logits, const long long* labels, float* grad,
                                           float* stats, u64 rows, u64 classes, float scale) {
    GRID_LOOP(r, rows) {
        const float* z = logits + r * classes;
        float* g = grad + r * classes;
        float m = z[0];
        u64 arg = 0;
        for (u64 c = 1; c < classes; ++c) {
            if (z[c] > m) { m = z[c]; arg = c; }
        }
        long long y = labels[r];
        if (y < 0 || (u64)y >= classes) {
            for (u64 c = 0; c < classes; ++c) g[c] = 0.0f;
            atomicAdd(&stats[2], 1.0f);
            continue;
        }
        float s = 0.0f;
        for (u64 c = 0; c < classes; ++c) s += expf(z[c] - m);
        for (u64 c = 0; c < classes; ++c) {
            float p = expf(z[c] - m) / s;
            g[c] = (p - (c == (u64)y ? 1.0f : 0.0f)) * scale;
        }
        atomicAdd(&stats[0], logf(s) + m - z[y]);
        if (arg == (u64)y) atomicAdd(&stats[1], 1.0f);
    }
}

extern "C" __global__ void ls_sgd_momentum(float* w, float* v, const float* g, u64 n, float lr,
                                           float momentum, float weight_decay) {
    GRID_LOOP(i, n) {
        float gi = g[i] + weight_decay * w[i];
        float vi = momentum * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * vi;
    }
}

extern "C" __global__ void ls_scale(float* x, u64 n, float alpha) {
    GRID_LOOP(i, n) {
        x[i] *= alpha;
    }
}

extern "C" __global__ void ls_normalize_u8(float* out, const unsigned char* in, const float* params,
                                           u64 n, u64 channels, u64 hw) {
    GRID_LOOP(i, n) {
        u64 c = (i / hw) % channels;
        out[i] = (float)in[i] * params[c] + params[channels + c];
    }
}
"#;

/// The kernels, loaded into one device's context.
struct Kernels {
    _module: Arc<CudaModule>,
    bias_act: CudaFunction,
    relu_backward: CudaFunction,
    bias_grad: CudaFunction,
    softmax_xent: CudaFunction,
    sgd: CudaFunction,
    normalize_u8: CudaFunction,
    scale: CudaFunction,
}

fn unavailable(
    op: &'static str,
    library: &'static str,
    ordinal: usize,
    reason: String,
) -> TransferError {
    TransferError::LibraryUnavailable {
        op,
        library,
        device: DeviceId::Cuda(ordinal),
        reason,
    }
}

fn check_libraries(op: &'static str, ordinal: usize) -> Result<()> {
    ffi::blas_available().map_err(|reason| unavailable(op, "cuBLAS", ordinal, reason))?;
    ffi::nvrtc_available().map_err(|reason| unavailable(op, "NVRTC", ordinal, reason))
}

fn ptx(op: &'static str, ordinal: usize) -> Result<Ptx> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| ffi::compile_ptx(KERNELS))
        .clone()
        .map(Ptx::from_src)
        .map_err(|reason| TransferError::Cuda {
            call: "nvrtcCompileProgram",
            code: reason,
            device: DeviceId::Cuda(ordinal),
            what: format!("compiling the ops kernels for {op}"),
        })
}

fn kernels(op: &'static str, ordinal: usize) -> Result<Arc<Kernels>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    let mut map = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(k) = map.get(&ordinal) {
        return Ok(k.clone());
    }
    check_libraries(op, ordinal)?;
    let ptx = ptx(op, ordinal)?;
    let ctx = context(ordinal)?;
    let e = |call, err| {
        driver_err(
            call,
            err,
            ordinal,
            format!("loading the ops kernels for {op}"),
        )
    };
    ctx.bind_to_thread().map_err(|x| e("cuCtxSetCurrent", x))?;
    let module = ctx.load_module(ptx).map_err(|x| e("cuModuleLoadData", x))?;
    let f = |name: &str| {
        module
            .load_function(name)
            .map_err(|x| e("cuModuleGetFunction", x))
    };
    let k = Arc::new(Kernels {
        bias_act: f("ls_bias_act")?,
        relu_backward: f("ls_relu_backward")?,
        bias_grad: f("ls_bias_grad")?,
        softmax_xent: f("ls_softmax_xent")?,
        sgd: f("ls_sgd_momentum")?,
        normalize_u8: f("ls_normalize_u8")?,
        scale: f("ls_scale")?,
        _module: module,
    });
    map.insert(ordinal, k.clone());
    tracing::debug!(target: "longshore_ops", device = ordinal, "ops kernels loaded");
    Ok(k)
}

/// Checks the libraries and loads the kernels for `device` (a CUDA device).
pub(crate) fn prepare(device: &Device) -> Result<()> {
    match device.id() {
        DeviceId::Cuda(ordinal) => kernels("ops::available", ordinal).map(|_| ()),
        DeviceId::Cpu => Err(TransferError::Invalid(
            "the cpu device reached the cuda backend of ops".to_owned(),
        )),
    }
}

/// The stream's ordinal and its per-stream state (made on first use).
fn parts(stream: &Stream) -> Result<(usize, Arc<OpsStream>)> {
    let DeviceId::Cuda(ordinal) = stream.device().id() else {
        return Err(TransferError::Invalid(
            "a cpu stream reached the cuda backend of ops".to_owned(),
        ));
    };
    let state = stream.local(|| {
        let ctx = context(ordinal)?;
        let raw = stream.as_raw()?;
        // SAFETY: `raw` is the CUstream of a transfer stream of this device's primary context;
        // the wrapper is kept in the stream's local state, which the stream drops before it
        // destroys the CUstream, so the wrapper never outlives it.
        let cs = unsafe { ctx.wrap_borrowed_stream(raw.cast()) };
        Ok(OpsStream {
            stream: cs,
            blas: Mutex::new(None),
        })
    })?;
    Ok((ordinal, state))
}

fn grid(n: usize) -> LaunchConfig {
    const THREADS: usize = 256;
    let blocks = n.div_ceil(THREADS).clamp(1, 65_535);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launch_err(
    op: &'static str,
    ordinal: usize,
    stream: &Stream,
) -> impl Fn(DriverError) -> TransferError {
    let id = stream.id();
    move |e| {
        driver_err(
            "cuLaunchKernel",
            e,
            ordinal,
            format!("launching {op} on stream {id}"),
        )
    }
}

fn blas(stream: &Stream, ordinal: usize, st: &OpsStream) -> Result<Arc<Mutex<Blas>>> {
    let mut slot = st.blas.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = &*slot {
        return Ok(b.clone());
    }
    check_libraries("gemm", ordinal)?;
    // SAFETY: the stream is a live CUstream of this device's primary context, current on this
    // thread (ops run inside `Stream::enqueue_work`); the handle is kept in the stream's local
    // state, dropped before the stream is destroyed.
    let b =
        unsafe { Blas::new(st.stream.cu_stream().cast()) }.map_err(|e| TransferError::Cuda {
            call: "cublasCreate_v2",
            code: e,
            device: DeviceId::Cuda(ordinal),
            what: format!("creating a cuBLAS handle for stream {}", stream.id()),
        })?;
    let b = Arc::new(Mutex::new(b));
    *slot = Some(b.clone());
    Ok(b)
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        TransferError::Invalid(format!("{op}: {what} = {v} exceeds cuBLAS's 32-bit sizes"))
    })
}

pub(crate) fn gemm(stream: &Stream, s: GemmShape, a: u64, b: u64, c: u64) -> Result<()> {
    const OP: &str = "gemm";
    let (ordinal, st) = parts(stream)?;
    let (m, n, k) = (int(OP, "m", s.m)?, int(OP, "n", s.n)?, int(OP, "k", s.k)?);
    let handle = blas(stream, ordinal, &st)?;
    let handle = handle.lock().unwrap_or_else(|p| p.into_inner());
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and
    // read each row-major matrix as its column-major transpose.
    let op_of = |t: bool| if t { ffi::OP_T } else { ffi::OP_N };
    let ldb = if s.trans_b { k } else { n };
    let lda = if s.trans_a { m } else { k };
    // SAFETY: the handle is bound to this stream in this device's context (made current by
    // `Stream::enqueue_work`, our caller). `a`, `b` and `c` point into live allocations of this
    // context with at least m*k, k*n and m*n f32 values (checked on the host); with the
    // leading dimensions above cuBLAS reads exactly those elements and writes only C's. C does
    // not overlap A or B (distinct buffers, guaranteed by the `&mut` borrow of C).
    unsafe {
        handle.sgemm(
            (op_of(s.trans_b), op_of(s.trans_a)),
            (n, m, k),
            s.alpha,
            (b as *const f32, ldb),
            (a as *const f32, lda),
            s.beta,
            (c as *mut f32, n),
        )
    }
    .map_err(|e| TransferError::Cuda {
        call: "cublasSgemm_v2",
        code: e,
        device: DeviceId::Cuda(ordinal),
        what: format!("{}x{}x{} product on stream {}", s.m, s.n, s.k, stream.id()),
    })
}

pub(crate) fn bias_act(
    stream: &Stream,
    y: u64,
    b: u64,
    rows: usize,
    cols: usize,
    act: Activation,
) -> Result<()> {
    const OP: &str = "bias_act";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let (rows64, cols64, relu) = (rows as u64, cols as u64, i32::from(act == Activation::Relu));
    let mut l = st.stream.launch_builder(&k.bias_act);
    l.arg(&y).arg(&b).arg(&rows64).arg(&cols64).arg(&relu);
    // SAFETY: `y` holds rows*cols f32 and `b` cols f32 (checked on the host); the kernel
    // touches y[i] for i < rows*cols and b[i % cols]. Argument types match the signature.
    unsafe { l.launch(grid(rows * cols)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn relu_backward(stream: &Stream, g: u64, o: u64, len: usize) -> Result<()> {
    const OP: &str = "relu_backward";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let n = len as u64;
    let mut l = st.stream.launch_builder(&k.relu_backward);
    l.arg(&g).arg(&o).arg(&n);
    // SAFETY: `g` and `o` each hold `len` f32 (checked on the host); the kernel indexes below
    // `len`. Argument types match the signature.
    unsafe { l.launch(grid(len)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn bias_grad(stream: &Stream, dy: u64, db: u64, rows: usize, cols: usize) -> Result<()> {
    const OP: &str = "bias_grad";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let (rows64, cols64) = (rows as u64, cols as u64);
    let mut l = st.stream.launch_builder(&k.bias_grad);
    l.arg(&db).arg(&dy).arg(&rows64).arg(&cols64);
    // SAFETY: `dy` holds rows*cols f32 and `db` cols f32 (checked on the host); the kernel
    // reads dy[r*cols + j] for r < rows, j < cols and writes db[j]. Types match.
    unsafe { l.launch(grid(cols)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn softmax_xent(
    stream: &Stream,
    [z, y, g, stats]: [u64; 4],
    rows: usize,
    classes: usize,
    scale: f32,
) -> Result<()> {
    const OP: &str = "softmax_cross_entropy";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let (rows64, classes64) = (rows as u64, classes as u64);
    let mut l = st.stream.launch_builder(&k.softmax_xent);
    l.arg(&z)
        .arg(&y)
        .arg(&g)
        .arg(&stats)
        .arg(&rows64)
        .arg(&classes64)
        .arg(&scale);
    // SAFETY: `z` and `g` hold rows*classes f32, `y` rows i64 (8-byte aligned), `stats` 3 f32
    // (checked on the host); the kernel reads z/g rows r < rows, label r, indexes z[label] only
    // after checking 0 <= label < classes, and adds to stats[0..3]. Types match.
    unsafe { l.launch(grid(rows)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn sgd(stream: &Stream, [p, v, g]: [u64; 3], len: usize, sgd: Sgd) -> Result<()> {
    const OP: &str = "sgd_momentum";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let n = len as u64;
    let mut l = st.stream.launch_builder(&k.sgd);
    l.arg(&p)
        .arg(&v)
        .arg(&g)
        .arg(&n)
        .arg(&sgd.lr)
        .arg(&sgd.momentum)
        .arg(&sgd.weight_decay);
    // SAFETY: `p`, `v` and `g` each hold `len` f32 (checked on the host), in distinct buffers;
    // the kernel indexes below `len`. Types match.
    unsafe { l.launch(grid(len)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn scale(stream: &Stream, x: u64, len: usize, alpha: f32) -> Result<()> {
    const OP: &str = "scale";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let n = len as u64;
    let mut l = st.stream.launch_builder(&k.scale);
    l.arg(&x).arg(&n).arg(&alpha);
    // SAFETY: `x` holds `len` f32 (checked on the host); the kernel indexes below `len`.
    // Types match.
    unsafe { l.launch(grid(len)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}

pub(crate) fn normalize_u8(
    stream: &Stream,
    [out, input, params]: [u64; 3],
    n: usize,
    channels: usize,
    hw: usize,
) -> Result<()> {
    const OP: &str = "normalize_u8";
    let (ordinal, st) = parts(stream)?;
    let k = kernels(OP, ordinal)?;
    let (n64, c64, hw64) = (n as u64, channels as u64, hw as u64);
    let mut l = st.stream.launch_builder(&k.normalize_u8);
    l.arg(&out)
        .arg(&input)
        .arg(&params)
        .arg(&n64)
        .arg(&c64)
        .arg(&hw64);
    // SAFETY: `out` holds n f32, `input` n u8, `params` 2*channels f32 (checked on the host);
    // the kernel indexes out/input below n and params below 2*channels. Types match.
    unsafe { l.launch(grid(n)) }
        .map(drop)
        .map_err(launch_err(OP, ordinal, stream))
}
