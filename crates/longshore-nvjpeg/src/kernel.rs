//! The crop + resize + normalise kernel, compiled once per process with NVRTC and loaded once
//! per device ([`Device::local`]); launched on a transfer stream through a cudarc view of its
//! `CUstream` kept in [`Stream::local`], as longshore-ops launches its kernels.
//!
//! One thread per output pixel (all three channels), one grid row per image. The arithmetic is
//! [`render_reference`](super::plan::render_reference)'s: PIL's antialiased bilinear taps of
//! the plan's box, a vertical pass rounded to 8 bits, then a horizontal pass rounded to 8 bits,
//! then `x * scale + bias` per channel (f32 CHW) or the 8-bit value (u8 CHW or HWC).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use longshore_transfer::{Device, DeviceId, Result, Stream, TransferError};

use super::ffi;

/// `i64`s per image in the kernel's parameter array.
pub(crate) const PARAMS: usize = 20;

/// The source of the kernel: `params` holds [`PARAMS`] `i64`s per image: source offset,
/// channel / row / pixel strides, box (x, y, w, h), resized (w, h), view (x, y), valid
/// (x0, y0, x1, y1), flip.
pub(crate) const SOURCE: &str = r#"
typedef long long i64;
#define NPARAMS 20

__device__ __forceinline__ float ls_tri(float x) {
    x = fabsf(x);
    return x < 1.0f ? 1.0f - x : 0.0f;
}

__device__ __forceinline__ float ls_clip8(float v) {
    return fminf(fmaxf(floorf(v + 0.5f), 0.0f), 255.0f);
}

extern "C" __global__ void ls_nvjpeg_resample(void* out, const unsigned char* src, const i64* params,
                                              int out_w, int out_h, int kind,
                                              float s0, float s1, float s2,
                                              float b0, float b1, float b2) {
    const int b = blockIdx.y;
    const int pix = blockIdx.x * blockDim.x + threadIdx.x;
    const int plane = out_w * out_h;
    if (pix >= plane) return;
    const int ox = pix % out_w;
    const int oy = pix / out_w;
    const i64* p = params + (i64)b * NPARAMS;
    const int lx = p[16] ? out_w - 1 - ox : ox;
    const i64 rx = p[10] + lx;
    const i64 ry = p[11] + oy;
    float v[3] = {0.0f, 0.0f, 0.0f};
    if (rx >= p[12] && rx < p[14] && ry >= p[13] && ry < p[15]) {
        const unsigned char* base = src + p[0];
        const i64 cs = p[1], rs = p[2], ps = p[3];
        const int bw = (int)p[6], bh = (int)p[7];
        const float scale_x = (float)bw / (float)p[8];
        const float fx = fmaxf(scale_x, 1.0f);
        const float cx = ((float)rx + 0.5f) * scale_x;
        const int x0 = max((int)(cx - fx + 0.5f), 0);
        const int x1 = min((int)(cx + fx + 0.5f), bw);
        const float scale_y = (float)bh / (float)p[9];
        const float fy = fmaxf(scale_y, 1.0f);
        const float cy = ((float)ry + 0.5f) * scale_y;
        const int y0 = max((int)(cy - fy + 0.5f), 0);
        const int y1 = min((int)(cy + fy + 0.5f), bh);
        float sx = 0.0f, sy = 0.0f;
        for (int i = x0; i < x1; ++i) sx += ls_tri(((float)i - cx + 0.5f) / fx);
        for (int j = y0; j < y1; ++j) sy += ls_tri(((float)j - cy + 0.5f) / fy);
        if (sx <= 0.0f) sx = 1.0f;
        if (sy <= 0.0f) sy = 1.0f;
        for (int c = 0; c < 3; ++c) {
            float acc = 0.0f;
            for (int i = x0; i < x1; ++i) {
                const float wx = ls_tri(((float)i - cx + 0.5f) / fx) / sx;
                const unsigned char* col = base + c * cs + p[5] * rs + (p[4] + i) * ps;
                float t = 0.0f;
                for (int j = y0; j < y1; ++j) {
                    const float wy = ls_tri(((float)j - cy + 0.5f) / fy) / sy;
                    t += wy * (float)col[(i64)j * rs];
                }
                acc += wx * ls_clip8(t);
            }
            v[c] = ls_clip8(acc);
        }
    }
    if (kind == 0) {
        float* o = (float*)out + (i64)b * 3 * plane;
        o[pix] = v[0] * s0 + b0;
        o[plane + pix] = v[1] * s1 + b1;
        o[2 * plane + pix] = v[2] * s2 + b2;
    } else if (kind == 1) {
        unsigned char* o = (unsigned char*)out + (i64)b * 3 * plane;
        o[pix] = (unsigned char)v[0];
        o[plane + pix] = (unsigned char)v[1];
        o[2 * plane + pix] = (unsigned char)v[2];
    } else {
        unsigned char* o = (unsigned char*)out + ((i64)b * plane + pix) * 3;
        o[0] = (unsigned char)v[0];
        o[1] = (unsigned char)v[1];
        o[2] = (unsigned char)v[2];
    }
}
"#;

fn driver_err(
    call: &'static str,
    e: cudarc::driver::DriverError,
    ordinal: usize,
    what: String,
) -> TransferError {
    TransferError::Cuda {
        call,
        code: format!("{:?}", e.0),
        device: DeviceId::Cuda(ordinal),
        what,
    }
}

/// The kernel, loaded into one device's context (kept in [`Device::local`]).
pub(crate) struct Kernel {
    ctx: Arc<CudaContext>,
    func: CudaFunction,
    _module: Arc<CudaModule>,
}

/// The cudarc view of a transfer stream (kept in [`Stream::local`], dropped before the
/// stream's `CUstream` is destroyed).
struct KernelStream(Arc<CudaStream>);

fn ptx(ordinal: usize) -> Result<Ptx> {
    static PTX: std::sync::OnceLock<std::result::Result<String, String>> =
        std::sync::OnceLock::new();
    PTX.get_or_init(|| ffi::compile_ptx(SOURCE))
        .clone()
        .map(Ptx::from_src)
        .map_err(|reason| {
            if reason.contains("could not be loaded") {
                TransferError::LibraryUnavailable {
                    op: "nvjpeg decode",
                    library: "NVRTC",
                    device: DeviceId::Cuda(ordinal),
                    reason,
                }
            } else {
                TransferError::Cuda {
                    call: "nvrtcCompileProgram",
                    code: reason,
                    device: DeviceId::Cuda(ordinal),
                    what: "compiling the nvjpeg resample kernel".into(),
                }
            }
        })
}

/// The device's primary context, as cudarc sees it (retained once per device).
pub(crate) fn context(device: &Device) -> Result<Arc<CudaContext>> {
    struct Ctx(Arc<CudaContext>);
    let DeviceId::Cuda(ordinal) = device.id() else {
        return Err(TransferError::Invalid(
            "nvjpeg decoding needs a cuda device".into(),
        ));
    };
    let c = device.local(|| {
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            driver_err(
                "cuDevicePrimaryCtxRetain",
                e,
                ordinal,
                "opening the context for nvjpeg".into(),
            )
        })?;
        // SAFETY: this crate never uses cudarc's CudaSlice, the only user of event tracking;
        // all ordering goes through transfer's events.
        unsafe { ctx.disable_event_tracking() };
        Ok(Ctx(ctx))
    })?;
    Ok(c.0.clone())
}

impl Kernel {
    /// The kernel of `device`, compiled and loaded on first use.
    pub(crate) fn get(device: &Device) -> Result<Arc<Kernel>> {
        let DeviceId::Cuda(ordinal) = device.id() else {
            return Err(TransferError::Invalid(
                "nvjpeg decoding needs a cuda device".into(),
            ));
        };
        device.local(|| {
            let ptx = ptx(ordinal)?;
            let ctx = context(device)?;
            let e = |call, err| driver_err(call, err, ordinal, "loading the nvjpeg resample kernel".into());
            ctx.bind_to_thread().map_err(|x| e("cuCtxSetCurrent", x))?;
            let module = ctx.load_module(ptx).map_err(|x| e("cuModuleLoadData", x))?;
            let func = module
                .load_function("ls_nvjpeg_resample")
                .map_err(|x| e("cuModuleGetFunction", x))?;
            tracing::debug!(target: "longshore::vision", device = ordinal, "nvjpeg resample kernel loaded");
            Ok(Kernel {
                ctx,
                func,
                _module: module,
            })
        })
    }

    /// Launches the kernel on `stream` for `images` images of `out_w x out_h`.
    ///
    /// # Safety
    /// `out` holds `images * 3 * out_w * out_h` elements of the output kind (f32 for kind 0,
    /// u8 otherwise); `params` holds `images * PARAMS` i64 whose offsets, strides and boxes
    /// address only bytes of `src`'s allocation; all three are device memory of this context,
    /// ready in `stream`'s order, and live until the launch completes. Called inside
    /// `Stream::enqueue_work` (the context is current).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        stream: &Stream,
        out: u64,
        src: u64,
        params: u64,
        images: usize,
        (out_w, out_h): (usize, usize),
        kind: i32,
        affine: [(f32, f32); 3],
    ) -> Result<()> {
        let DeviceId::Cuda(ordinal) = stream.device().id() else {
            return Err(TransferError::Invalid(
                "a cpu stream reached the nvjpeg kernel".into(),
            ));
        };
        let st = stream.local(|| {
            let raw = stream.as_raw()?;
            // SAFETY: `raw` is the CUstream of a transfer stream of this device's primary
            // context; the wrapper lives in the stream's local state, which the stream drops
            // before it destroys the CUstream.
            Ok(KernelStream(unsafe {
                self.ctx.wrap_borrowed_stream(raw.cast())
            }))
        })?;
        let plane = out_w * out_h;
        let too_big = |what: &str| {
            TransferError::Invalid(format!("nvjpeg kernel: {what} exceeds the launch limits"))
        };
        let (w, h) = (
            i32::try_from(out_w).map_err(|_| too_big("output width"))?,
            i32::try_from(out_h).map_err(|_| too_big("output height"))?,
        );
        i32::try_from(plane).map_err(|_| too_big("output size"))?;
        let rows = u32::try_from(images)
            .ok()
            .filter(|&n| n <= 65_535)
            .ok_or_else(|| too_big("batch size"))?;
        const THREADS: usize = 256;
        let cfg = LaunchConfig {
            grid_dim: (plane.div_ceil(THREADS) as u32, rows, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let [(s0, b0), (s1, b1), (s2, b2)] = affine;
        let mut l = st.0.launch_builder(&self.func);
        l.arg(&out)
            .arg(&src)
            .arg(&params)
            .arg(&w)
            .arg(&h)
            .arg(&kind)
            .arg(&s0)
            .arg(&s1)
            .arg(&s2)
            .arg(&b0)
            .arg(&b1)
            .arg(&b2);
        // SAFETY: forwarded from the caller; the kernel indexes `out` below images * 3 * plane
        // and reads `src` only at the offsets the params give. Argument types match the
        // signature (u64 pointers, int, float).
        unsafe { l.launch(cfg) }.map(drop).map_err(|e| {
            driver_err(
                "cuLaunchKernel",
                e,
                ordinal,
                format!(
                    "launching the nvjpeg resample kernel on stream {}",
                    stream.id()
                ),
            )
        })
    }
}
