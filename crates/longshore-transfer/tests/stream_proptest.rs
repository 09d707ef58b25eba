//! Random interleavings of copies, fills, records and waits across several `Cpu` streams end
//! with the same data as a sequential model: buffers order their uses across streams.

use std::time::Duration;

use longshore_host::{HostBuffer, MemoryKind};
use longshore_transfer::{Device, Pending, UploadMode};
use proptest::prelude::*;

const STREAMS: usize = 3;
const BUFS: usize = 3;
const LEN: usize = 64;

#[derive(Debug, Clone)]
enum Op {
    Upload {
        stream: usize,
        buf: usize,
        offset: usize,
        len: usize,
        byte: u8,
    },
    UploadSlice {
        stream: usize,
        buf: usize,
        offset: usize,
        len: usize,
        byte: u8,
    },
    Fill {
        stream: usize,
        buf: usize,
        byte: u8,
    },
    Copy {
        stream: usize,
        src: usize,
        dst: usize,
    },
    Download {
        stream: usize,
        buf: usize,
    },
    Wait {
        waiter: usize,
        on: usize,
    },
    Stall {
        stream: usize,
        micros: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let region = (0..LEN).prop_flat_map(|o| (Just(o), 1..=LEN - o));
    prop_oneof![
        (0..STREAMS, 0..BUFS, region.clone(), any::<u8>()).prop_map(
            |(stream, buf, (offset, len), byte)| Op::Upload {
                stream,
                buf,
                offset,
                len,
                byte
            }
        ),
        (0..STREAMS, 0..BUFS, region, any::<u8>()).prop_map(
            |(stream, buf, (offset, len), byte)| Op::UploadSlice {
                stream,
                buf,
                offset,
                len,
                byte
            }
        ),
        (0..STREAMS, 0..BUFS, any::<u8>()).prop_map(|(stream, buf, byte)| Op::Fill {
            stream,
            buf,
            byte
        }),
        (0..STREAMS, 0..BUFS, 0..BUFS)
            .prop_filter("distinct buffers", |(_, s, d)| s != d)
            .prop_map(|(stream, src, dst)| Op::Copy { stream, src, dst }),
        (0..STREAMS, 0..BUFS).prop_map(|(stream, buf)| Op::Download { stream, buf }),
        (0..STREAMS, 0..STREAMS).prop_map(|(waiter, on)| Op::Wait { waiter, on }),
        (0..STREAMS, 0..300u64).prop_map(|(stream, micros)| Op::Stall { stream, micros }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn interleavings_match_a_sequential_model(ops in prop::collection::vec(op(), 1..40)) {
        let dev = Device::cpu();
        let streams: Vec<_> = (0..STREAMS).map(|_| dev.new_stream().unwrap()).collect();
        let mut bufs: Vec<_> = (0..BUFS).map(|_| streams[0].alloc_zeroed(LEN).unwrap()).collect();
        let mut model = vec![vec![0u8; LEN]; BUFS];
        let mut reads: Vec<(Pending<HostBuffer>, Vec<u8>)> = Vec::new();
        for op in &ops {
            match *op {
                Op::Upload { stream, buf, offset, len, byte } => {
                    let src = HostBuffer::from_slice(MemoryKind::Pageable, &vec![byte; len]).unwrap();
                    drop(streams[stream].upload_at(src, &mut bufs[buf], offset).unwrap());
                    model[buf][offset..offset + len].fill(byte);
                }
                Op::UploadSlice { stream, buf, offset, len, byte } => {
                    streams[stream].upload_slice(&vec![byte; len], &mut bufs[buf], offset, UploadMode::Direct).unwrap();
                    model[buf][offset..offset + len].fill(byte);
                }
                Op::Fill { stream, buf, byte } => {
                    streams[stream].memset(&mut bufs[buf], byte).unwrap();
                    model[buf].fill(byte);
                }
                Op::Copy { stream, src, dst } => {
                    let (s, d) = if src < dst {
                        let (a, b) = bufs.split_at_mut(dst);
                        (&a[src], &mut b[0])
                    } else {
                        let (a, b) = bufs.split_at_mut(src);
                        (&b[0], &mut a[dst])
                    };
                    streams[stream].copy(s, 0, d, 0, LEN).unwrap();
                    model[dst] = model[src].clone();
                }
                Op::Download { stream, buf } => {
                    let out = HostBuffer::pageable(LEN).unwrap();
                    reads.push((streams[stream].download(&bufs[buf], out).unwrap(), model[buf].clone()));
                }
                Op::Wait { waiter, on } => {
                    let ev = streams[on].record().unwrap();
                    streams[waiter].wait_event(&ev).unwrap();
                }
                Op::Stall { stream, micros } => {
                    streams[stream].launch_host_fn(move || std::thread::sleep(Duration::from_micros(micros))).unwrap();
                }
            }
        }
        for (i, (pending, expected)) in reads.into_iter().enumerate() {
            let got = pending.wait().unwrap();
            prop_assert_eq!(got.as_bytes(), &expected[..], "download #{}", i);
        }
        for (b, buf) in bufs.iter().enumerate() {
            let got = streams[(b + 1) % STREAMS].read_to_vec::<u8>(buf).unwrap();
            prop_assert_eq!(&got, &model[b], "final contents of buffer {}", b);
        }
    }
}
