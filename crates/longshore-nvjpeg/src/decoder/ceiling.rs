//! [`NvjpegDecoder::ceiling`]: what nvJPEG itself does on this GPU, on one thread, with no
//! loader: the hardware batched decode alone over one host batch already in page-locked
//! memory, then with the routing checks, then the whole device stage (routes, decode, kernel),
//! so a benchmark can say how far the pipeline is from the library's own rate.

use std::sync::Barrier;
use std::time::Instant;

use longshore_data::{Batch, Storage};
use longshore_loader::LoaderError;
use longshore_transfer::TransferError;

use super::super::encoded::{Payload, entries};
use super::super::header::JpegHeader;
use super::NvjpegDecoder;

/// What [`NvjpegDecoder::ceiling`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CeilingStage {
    /// The workers' marker walk ([`JpegHeader::walk`] and its route) of every JPEG, on this
    /// thread: the per-image routing work that moved off the device stage.
    Walk,
    /// `nvjpegDecodeBatched` on the hardware backend alone, over the batch's JPEGs the workers
    /// routed to the engines.
    Decode,
    /// The same JPEGs through `nvjpegDecodeBatched` on the `GPU_HYBRID` backend (the CUDA
    /// cores, no engines).
    DecodeCuda,
    /// The same, each image first checked with nvJPEG as the device stage did before the
    /// workers routed (`nvjpegGetImageInfo`, `nvjpegJpegStreamParse`,
    /// `nvjpegDecodeBatchedSupported`).
    DecodeChecked,
    /// The whole device stage ([`NvjpegDecoder::decode`]'s work, routes trusted): decode,
    /// crop/resize/normalise kernel, uploads, a device batch per iteration.
    Pipeline,
    /// [`Pipeline`](CeilingStage::Pipeline) with every JPEG checked by nvJPEG
    /// ([`NvjpegDecoder::verify_routes`]).
    PipelineChecked,
}

impl CeilingStage {
    /// Every stage, in the order a benchmark reports them.
    pub const ALL: [CeilingStage; 6] = [
        CeilingStage::Walk,
        CeilingStage::Decode,
        CeilingStage::DecodeCuda,
        CeilingStage::DecodeChecked,
        CeilingStage::Pipeline,
        CeilingStage::PipelineChecked,
    ];

    /// A short name (`walk`, `decode`, `decode_checked`, `pipeline`, `pipeline_checked`).
    pub fn name(self) -> &'static str {
        match self {
            CeilingStage::Walk => "walk",
            CeilingStage::Decode => "decode",
            CeilingStage::DecodeCuda => "decode_cuda",
            CeilingStage::DecodeChecked => "decode_checked",
            CeilingStage::Pipeline => "pipeline",
            CeilingStage::PipelineChecked => "pipeline_checked",
        }
    }
}

/// One stage's measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CeilingRun {
    /// What was timed.
    pub stage: CeilingStage,
    /// Images processed over the timed iterations.
    pub images: u64,
    /// Seconds, from the first iteration to the stream's synchronisation after the last.
    pub seconds: f64,
}

impl CeilingRun {
    /// Images per second.
    pub fn images_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.images as f64 / self.seconds
        } else {
            0.0
        }
    }
}

impl NvjpegDecoder {
    /// Times `stage` over `iterations` passes of `batch` (a host batch of
    /// [`EncodedCollate`](super::super::EncodedCollate), best in page-locked memory, as the
    /// loader's are), after one untimed pass; on this thread, with the decoder's slots as the
    /// device stage uses them. The batch is only borrowed: the stream is synchronised before
    /// this returns.
    ///
    /// # Errors
    /// [`LoaderError::Data`] for a batch not written by `EncodedCollate`; device errors;
    /// [`TransferError::Invalid`] for the decode stages where there is no hardware backend.
    pub fn ceiling<S: Storage>(
        &mut self,
        batch: &Batch<S>,
        stage: CeilingStage,
        iterations: usize,
    ) -> Result<CeilingRun, LoaderError> {
        self.ceiling_from(batch, stage, iterations, None)
    }

    /// [`ceiling`](NvjpegDecoder::ceiling) on `threads` threads at once, each with its own
    /// [`lane`](NvjpegDecoder::lane) (states and stream; kept in this decoder afterwards),
    /// their timed passes started together after each one's untimed pass: `images` is the sum
    /// over the threads and `seconds` the longest thread's time, so the rate is what they
    /// decode together. Tells whether the bound of one thread is the GPU's engines (no gain)
    /// or the host side of nvJPEG's calls.
    ///
    /// # Errors
    /// As [`ceiling`](NvjpegDecoder::ceiling); the first thread's error.
    pub fn ceiling_threads<S: Storage + Sync>(
        &mut self,
        batch: &Batch<S>,
        stage: CeilingStage,
        iterations: usize,
        threads: usize,
    ) -> Result<CeilingRun, LoaderError> {
        let threads = threads.max(1);
        let mut lanes = Vec::with_capacity(threads);
        for _ in 0..threads {
            lanes.push(self.lane()?);
        }
        let start = Barrier::new(threads);
        let results: Vec<(NvjpegDecoder, Result<CeilingRun, LoaderError>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = lanes
                    .into_iter()
                    .map(|mut lane| {
                        let start = &start;
                        scope.spawn(move || {
                            let r = match lane.enter() {
                                Ok(()) => lane.ceiling_from(batch, stage, iterations, Some(start)),
                                Err(e) => {
                                    // The others wait for this thread at the barrier.
                                    start.wait();
                                    Err(e.into())
                                }
                            };
                            (lane, r)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|p| {
                            std::panic::resume_unwind(p);
                        })
                    })
                    .collect()
            });
        let (mut images, mut seconds, mut first_err) = (0, 0f64, None);
        for (lane, r) in results {
            self.stats += &lane.stats;
            match r {
                Ok(run) => {
                    images += run.images;
                    seconds = seconds.max(run.seconds);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(CeilingRun {
                stage,
                images,
                seconds,
            }),
        }
    }

    fn ceiling_from<S: Storage>(
        &mut self,
        batch: &Batch<S>,
        stage: CeilingStage,
        iterations: usize,
        start: Option<&Barrier>,
    ) -> Result<CeilingRun, LoaderError> {
        let (rows, bytes) = entries(batch)?;
        let jpegs: Vec<(&[u8], (usize, usize), bool)> = rows
            .iter()
            .filter(|e| e.payload == Payload::Jpeg)
            .map(|e| {
                (
                    &bytes[e.offset..e.offset + e.len],
                    (e.width, e.height),
                    e.hardware,
                )
            })
            .collect();
        let hw: Vec<&[u8]> = jpegs.iter().filter(|j| j.2).map(|j| j.0).collect();
        let dims: Vec<(usize, usize)> = jpegs.iter().filter(|j| j.2).map(|j| j.1).collect();
        let verify = self.verify;
        self.verify = stage == CeilingStage::PipelineChecked;
        let pass = |dec: &mut NvjpegDecoder, seq: u64| -> Result<u64, LoaderError> {
            Ok(match stage {
                CeilingStage::Walk => {
                    let mut n = 0u64;
                    for (d, _, _) in &jpegs {
                        if let Ok(h) = JpegHeader::walk(d) {
                            std::hint::black_box(h.route());
                            n += 1;
                        }
                    }
                    n
                }
                CeilingStage::Decode | CeilingStage::DecodeChecked | CeilingStage::DecodeCuda => {
                    if hw.is_empty() {
                        return Err(TransferError::Invalid(
                            "nvjpeg ceiling: the batch holds no jpeg the hardware engines take"
                                .into(),
                        )
                        .into());
                    }
                    dec.decode_only(
                        &hw,
                        &dims,
                        stage == CeilingStage::DecodeChecked,
                        stage == CeilingStage::DecodeCuda,
                    )? as u64
                }
                CeilingStage::Pipeline | CeilingStage::PipelineChecked => {
                    let mut fence = None;
                    dec.run(seq, batch, &mut fence)?
                        .map_or(0, |b| b.batch_size() as u64)
                }
            })
        };
        let mut waited = false;
        let result = (|| {
            let warm = pass(self, 0).and_then(|_| Ok(self.stream.synchronize()?));
            if let Some(b) = start {
                waited = true;
                b.wait();
            }
            warm?;
            let t = Instant::now();
            let mut images = 0;
            for i in 0..iterations {
                images += pass(self, i as u64 + 1)?;
            }
            self.stream.synchronize()?;
            Ok(CeilingRun {
                stage,
                images,
                seconds: t.elapsed().as_secs_f64(),
            })
        })();
        // The batch is borrowed: nothing may read it after this returns, even on an error.
        if let Err(e) = self.stream.synchronize() {
            tracing::error!(target: "longshore::vision", error = %e, "synchronising after an nvjpeg ceiling run");
        }
        self.sync_slots();
        self.verify = verify;
        if let (Some(b), false) = (start, waited) {
            b.wait();
        }
        result
    }
}
