//! The one geometry plan: `Compose` draws a `Geometry` (every random parameter) and renders
//! it; rendering the drawn plan is the pipeline, the draws consume the generator exactly as
//! the transforms do, and a plan is resolved for its image's size.

use longshore_data::ImageLayout;
use longshore_data::rng::{Rng, epoch_rng};
use longshore_vision::plan::{Geometry, PlannedStep};
use longshore_vision::transforms::{
    CenterCrop, CropBox, Interpolation, RandomHorizontalFlip, RandomResizedCrop, Resize,
};
use longshore_vision::{Compose, Output, RgbImage, Step};
use proptest::prelude::*;

fn image(w: usize, h: usize, seed: u64) -> RgbImage {
    let mut rng = epoch_rng(seed, 0);
    let px = (0..w * h * 3)
        .map(|_| longshore_data::rng::below(&mut rng, 256) as u8)
        .collect();
    RgbImage::from_vec(w, h, px).unwrap()
}

/// A pipeline of 1..5 steps ending in a fixed size: flips anywhere, crops that pad or not,
/// resizes of every filter, random and fixed resized crops.
fn pipeline() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        (4usize..40).prop_map(|s| Step::from(RandomResizedCrop::new(s).unwrap())),
        (4usize..60, 0usize..3).prop_map(|(s, i)| {
            let i = [
                Interpolation::Bilinear,
                Interpolation::Nearest,
                Interpolation::Bicubic,
            ][i];
            Step::from(Resize::new(s).unwrap().interpolation(i))
        }),
        (1usize..50).prop_map(|s| Step::from(CenterCrop::new(s).unwrap())),
        (0.0f64..=1.0)
            .prop_map(|p| Step::from(RandomHorizontalFlip::new(p, ImageLayout::Hwc).unwrap())),
        (0i64..8, 0i64..8, 1usize..20, 1usize..20).prop_map(|(top, left, h, w)| {
            Step::ResizedCrop {
                crop: CropBox {
                    top,
                    left,
                    height: h,
                    width: w,
                },
                height: 12,
                width: 10,
                interpolation: Interpolation::Bilinear,
            }
        }),
    ];
    (proptest::collection::vec(step, 0..4), 2usize..30).prop_map(|(mut steps, c)| {
        steps.push(CenterCrop::new(c).unwrap().into());
        steps
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Applying a pipeline is rendering the plan it draws: same pixels, same generator state
    /// after, and the plan ends at the pipeline's output size.
    #[test]
    fn apply_renders_the_drawn_plan(
        steps in pipeline(),
        w in 1usize..70,
        h in 1usize..70,
        seed in any::<u64>(),
    ) {
        let compose = Compose::new(steps, Output::U8Hwc).unwrap();
        let img = image(w, h, seed);
        let mut a: Rng = epoch_rng(seed, 1);
        let mut applied = vec![0u8; compose.output_bytes()];
        let applied_ok = compose.apply_into(&img, &mut a, &mut applied);

        let mut b: Rng = epoch_rng(seed, 1);
        let geometry = compose.geometry(w, h, &mut b).unwrap();
        prop_assert_eq!(geometry.output_size(), compose.output_size());
        prop_assert_eq!(geometry.input_size(), (w, h));
        let mut rendered = vec![0u8; compose.output_bytes()];
        let rendered_ok = compose.render_into(&geometry, &img, &mut rendered);
        match (applied_ok, rendered_ok) {
            (Ok(()), Ok(())) => prop_assert_eq!(&applied, &rendered),
            // A fixed box outside the image: the same error, naming the box.
            (Err(x), Err(y)) => {
                prop_assert_eq!(x.to_string(), y.to_string());
                prop_assert!(x.to_string().contains("has no pixels inside"), "{}", x);
            }
            (x, y) => prop_assert!(false, "apply {:?}, render {:?}", x, y),
        }
        prop_assert_eq!(longshore_data::rng::below(&mut a, 1 << 30), longshore_data::rng::below(&mut b, 1 << 30));
    }
}

#[test]
fn a_plan_names_its_resolved_steps() {
    // RandomResizedCrop(8) then a flip that always comes up: the box drawn, the flip kept.
    let steps = [
        RandomResizedCrop::new(8).unwrap().into(),
        RandomHorizontalFlip::new(1.0, ImageLayout::Hwc)
            .unwrap()
            .into(),
    ];
    let mut rng = epoch_rng(5, 0);
    let g = Geometry::draw(&steps, 40, 30, &mut rng).unwrap();
    let [
        PlannedStep::ResizedCrop {
            crop,
            width,
            height,
            ..
        },
        PlannedStep::Flip,
    ] = g.steps()
    else {
        panic!("{:?}", g.steps());
    };
    assert_eq!((*width, *height), (8, 8));
    assert!(
        crop.left >= 0 && crop.left as usize + crop.width <= 40,
        "{crop:?}"
    );
    assert!(
        crop.top >= 0 && crop.top as usize + crop.height <= 30,
        "{crop:?}"
    );
    // A flip whose coin never comes up and a Resize that keeps the size leave no step.
    let steps = [
        RandomHorizontalFlip::new(0.0, ImageLayout::Hwc)
            .unwrap()
            .into(),
        Resize::exact(30, 40).unwrap().into(),
    ];
    let g = Geometry::draw(&steps, 40, 30, &mut rng).unwrap();
    assert!(g.steps().is_empty(), "{:?}", g.steps());
    assert_eq!(g.output_size(), (30, 40));
    // No pixels, no plan.
    let e = Geometry::draw(&steps, 0, 30, &mut rng).unwrap_err();
    assert!(e.to_string().contains("0x30"), "{e}");
}

#[test]
fn a_plan_renders_only_on_its_image_size() {
    let compose = Compose::val(16, 12, Output::U8Chw);
    let g = compose.geometry(20, 30, &mut epoch_rng(0, 0)).unwrap();
    let mut out = vec![0u8; compose.output_bytes()];
    let e = compose
        .render_into(&g, &image(30, 20, 0), &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("20x30"), "{e}");
    compose
        .render_into(&g, &image(20, 30, 0), &mut out)
        .unwrap();
}
