//! `#[derive(Sample)]`: a struct's tensor fields become the batch's tensors in declaration
//! order, through StackCollate, PadCollate and a map-style dataset, for named, tuple and
//! generic structs, with skipped fields left out.

use longshore_data::{
    Collate, DType, DatasetCollate, FetchCollate, PadCollate, Sample, StackCollate, Tensor,
    VecDataset,
};

#[derive(Debug, Clone, Sample)]
struct Item {
    image: [[u8; 3]; 2],
    #[sample(skip)]
    path: String,
    label: i64,
    weight: f32,
}

#[derive(Debug, Clone, Sample)]
struct Pair(#[sample(skip)] &'static str, Vec<i32>, u16);

#[derive(Debug, Clone, Sample)]
struct Generic<T, U>
where
    U: Clone,
{
    x: [T; 2],
    #[sample(skip)]
    tag: U,
    t: Tensor,
}

fn item(i: u8) -> Item {
    Item {
        image: [[i, i + 1, i + 2], [i + 3, i + 4, i + 5]],
        path: format!("img{i}.png"),
        label: i64::from(i) * 10,
        weight: f32::from(i) / 2.0,
    }
}

#[test]
fn fields_in_declaration_order_skipping_marked_ones() {
    let it = item(1);
    assert_eq!(it.num_fields(), 3);
    let image = it.field(0).unwrap();
    assert_eq!(
        (image.dtype(), image.shape().dims()),
        (DType::U8, &[2, 3][..])
    );
    assert_eq!(image.bytes(), &[1, 2, 3, 4, 5, 6]);
    assert_eq!(it.field(1).unwrap().dtype(), DType::I64);
    assert_eq!(it.field(1).unwrap().bytes(), &10i64.to_ne_bytes());
    assert_eq!(it.field(2).unwrap().dtype(), DType::F32);
    assert!(it.field(3).is_none());
    assert_eq!(it.path, "img1.png");
}

#[test]
fn a_derived_struct_stacks_like_the_equivalent_tuple() {
    let items: Vec<Item> = (0..4).map(item).collect();
    let tuples: Vec<_> = items.iter().map(|i| (i.image, i.label, i.weight)).collect();
    let a = StackCollate::new()
        .with_names(["image", "label", "weight"])
        .collate(&items)
        .unwrap();
    let b = StackCollate::new()
        .with_names(["image", "label", "weight"])
        .collate(&tuples)
        .unwrap();
    assert_eq!(a.layout(), b.layout());
    assert_eq!(a.bytes(), b.bytes());
    assert_eq!(a.shape(0).unwrap(), &[4, 2, 3]);
    assert_eq!(a.tensor_by_name::<i64>("label").unwrap(), &[0, 10, 20, 30]);
}

#[test]
fn a_derived_struct_is_a_dataset_item() {
    let ds = VecDataset::new((0..10).map(item).collect());
    let collate = FetchCollate(StackCollate::new());
    let staged = collate.stage(&ds, &[9, 2]).unwrap();
    let need = staged.layout().total_bytes();
    let batch = collate
        .write(&ds, staged, longshore_data::AlignedBuf::zeroed(need))
        .unwrap();
    assert_eq!(batch.tensor::<i64>(1).unwrap(), &[90, 20]);
    assert_eq!(batch.tensor::<f32>(2).unwrap(), &[4.5, 1.0]);
}

#[test]
fn tuple_structs_pad_and_generic_structs_work() {
    let pairs = vec![Pair("a", vec![1, 2, 3], 7), Pair("b", vec![4], 8)];
    assert_eq!(pairs[0].num_fields(), 2);
    assert_eq!((pairs[0].0, pairs[1].0), ("a", "b"));
    let batch = PadCollate::new(-1.0).collate(&pairs).unwrap();
    assert_eq!(batch.shape(0).unwrap(), &[2, 3]);
    assert_eq!(batch.tensor::<i32>(0).unwrap(), &[1, 2, 3, 4, -1, -1]);
    assert_eq!(batch.tensor::<u16>(1).unwrap(), &[7, 8]);

    let g = Generic {
        x: [1.5f64, 2.5],
        tag: "skipped",
        t: Tensor::from_slice::<i8>(&[2], &[-1, 1]).unwrap(),
    };
    assert_eq!(g.num_fields(), 2);
    assert_eq!(g.field(0).unwrap().dtype(), DType::F64);
    assert_eq!(g.field(1).unwrap().bytes(), &[0xff, 1]);
    assert_eq!(g.tag, "skipped");
}
