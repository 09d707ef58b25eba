//! A host batch exported as DLPack tensors reads back the collated values, through the safe
//! accessors and through the raw struct a consumer receives.

mod common;

use common::{batch, f32s, i64s, pool, read_raw};
use longshore_dlpack::ffi::{
    DLDataTypeCode, DLDevice, DLDeviceType, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION,
};
use longshore_dlpack::{DlpackError, DlpackTensor, ExportOptions, export_host, wants_versioned};

#[test]
fn host_batch_round_trips_through_the_versioned_struct() {
    let pool = pool(false);
    let tensors = export_host(batch(&pool, 3, 4), &ExportOptions::default()).unwrap();
    assert_eq!(tensors.len(), 2);
    let (x, y) = (&tensors[0], &tensors[1]);
    assert_eq!((x.name(), y.name()), (Some("x"), Some("y")));
    assert_eq!(x.shape(), &[4, 5]);
    assert_eq!(x.strides(), &[5, 1]);
    assert_eq!(y.shape(), &[4]);
    assert_eq!(x.dtype().code, DLDataTypeCode::FLOAT);
    assert_eq!((x.dtype().bits, x.dtype().lanes), (32, 1));
    assert_eq!((y.dtype().code, y.dtype().bits), (DLDataTypeCode::INT, 64));
    // Pageable memory is kDLCPU.
    assert_eq!(
        x.device(),
        DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0
        }
    );
    assert!(!x.is_read_only());
    let want: Vec<f32> = (3..7)
        .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
        .collect();
    assert_eq!(f32s(x), want);
    assert_eq!(i64s(y), vec![3, 4, 5, 6]);

    // What a consumer sees.
    let mut it = tensors.into_iter();
    let x = it.next().unwrap();
    let bytes = x.byte_len();
    let raw = x.into_raw();
    // SAFETY: `raw` is a live export until its deleter runs below.
    unsafe {
        let m = &*raw;
        assert_eq!(m.version.major, DLPACK_MAJOR_VERSION);
        assert_eq!(m.flags, 0);
        let t = &m.dl_tensor;
        assert_eq!(t.ndim, 2);
        assert_eq!(std::slice::from_raw_parts(t.shape, 2), &[4, 5]);
        assert_eq!(std::slice::from_raw_parts(t.strides, 2), &[5, 1]);
        assert_eq!(t.byte_offset, 0);
        let got = read_raw(t.data, bytes);
        let want_bytes: Vec<u8> = want.iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(got, want_bytes);
        (m.deleter.unwrap())(raw);
    }
}

#[test]
fn legacy_struct_carries_the_same_view() {
    let pool = pool(false);
    let mut tensors = export_host(batch(&pool, 0, 2), &ExportOptions::default()).unwrap();
    let y = tensors.pop().unwrap();
    let raw = y.into_raw_legacy().map_err(|(e, _)| e).unwrap();
    // SAFETY: a live legacy export until its deleter runs.
    unsafe {
        let t = &(*raw).dl_tensor;
        assert_eq!(t.ndim, 1);
        assert_eq!(*t.shape, 2);
        assert_eq!(
            read_raw(t.data, 16),
            [0i64, 1].map(i64::to_ne_bytes).concat()
        );
        ((*raw).deleter.unwrap())(raw);
    }
}

#[test]
fn read_only_sets_the_flag_and_refuses_the_legacy_struct() {
    let pool = pool(false);
    let opts = ExportOptions::default().read_only(true);
    let mut tensors = export_host(batch(&pool, 0, 2), &opts).unwrap();
    let x = tensors.remove(0);
    assert!(x.is_read_only());
    let (err, x) = x.into_raw_legacy().unwrap_err();
    assert!(matches!(err, DlpackError::Unsupported { .. }), "{err}");
    let raw = x.into_raw();
    // SAFETY: a live export until its deleter runs.
    unsafe {
        assert_eq!((*raw).flags & DLPACK_FLAG_BITMASK_READ_ONLY, 1);
        ((*raw).deleter.unwrap())(raw);
    }
}

#[test]
fn protocol_arguments_are_checked() {
    let pool = pool(false);
    let mut tensors = export_host(batch(&pool, 0, 2), &ExportOptions::default()).unwrap();
    let x = &mut tensors[0];
    // Host memory: any stream argument only makes the host wait for the data.
    x.prepare_for_stream(None).unwrap();
    // Same device: fine. Another device or a forced copy: refused (no copies here).
    let cpu = x.device();
    x.request(Some(cpu), Some(false)).unwrap();
    let cuda = DLDevice {
        device_type: DLDeviceType::CUDA,
        device_id: 0,
    };
    assert!(matches!(
        x.request(Some(cuda), None),
        Err(DlpackError::Unsupported { .. })
    ));
    assert!(matches!(
        x.request(None, Some(true)),
        Err(DlpackError::Unsupported { .. })
    ));
    assert!(wants_versioned(Some((1, 0))));
    assert!(wants_versioned(Some((2, 3))));
    assert!(!wants_versioned(Some((0, 8))));
    assert!(!wants_versioned(None));
}

#[test]
fn from_raw_takes_a_tensor_back() {
    let pool = pool(false);
    let tensors = export_host(batch(&pool, 5, 3), &ExportOptions::default()).unwrap();
    let y = tensors.into_iter().nth(1).unwrap();
    let raw = y.into_raw();
    // SAFETY: `raw` came from into_raw and its deleter has not run.
    let back = unsafe { DlpackTensor::from_raw(raw) };
    assert_eq!(i64s(&back), vec![5, 6, 7]);
    drop(back);
    assert_eq!(pool.stats().bytes_in_use, 0);
}
