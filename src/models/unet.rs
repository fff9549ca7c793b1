//! A small 2-D U-Net (Ronneberger et al. 2015) in NHWC with spatial partitioning (paper
//! section 3.3, "image models"): the batch over `data`, the image height over `space`;
//! every weight replicated, so its gradient is all-reduced over both axes. Convolutions
//! along the split height need their neighbours' rows (a halo, or a gather).
//!
//! Two down blocks (3x3 convs and 2x2 max pooling), a bottleneck conv, two up blocks
//! (2x nearest upsampling and a 3x3 conv, concatenated with the skip connection along
//! channels, then a 3x3 conv) and a 1x1 output conv. Channels are fixed small (8 and 16)
//! so a CPU training step is fast; `B`, `H` and `W` are bound when tracing (`H` and `W`
//! divisible by 4).

use crate::ir::{Padding, Tensor};

/// `relu(conv3x3(x, w))` with `Same` padding.
pub fn conv_relu(x: &Tensor, w: &Tensor) -> Tensor {
    x.conv2d(w, [1, 1], Padding::Same).relu()
}

/// 2x2 max pooling, stride 2, of NHWC `x`.
pub fn pool(x: &Tensor) -> Tensor {
    x.max_pool(&[1, 2, 2, 1], &[1, 2, 2, 1], Padding::Valid)
}

/// An up block: `x` upsampled 2x (nearest) and conv3x3-relu'd by `w_up`, joined with
/// `skip` along channels, then conv3x3-relu'd by `w_merge`.
pub fn up(x: &Tensor, skip: &Tensor, w_up: &Tensor, w_merge: &Tensor) -> Tensor {
    let upsampled = conv_relu(&x.upsample_nearest(&[1, 2, 2, 1]), w_up);
    let joined = x.builder().concatenate(&[&upsampled, skip], 3);
    conv_relu(&joined, w_merge)
}

/// The denoising loss of the U-Net: the mean squared error of its prediction for
/// `noisy` (NHWC, one channel in and out) against `clean`.
#[crate::model(mesh = (data, space))]
#[allow(clippy::too_many_arguments)]
pub fn denoise(
    #[shard(data, space, _, _)] noisy: Tensor<B, H, W, 1>,
    #[shard(data, space, _, _)] clean: Tensor<B, H, W, 1>,
    #[shard(_, _, _, _)] down1a: Tensor<3, 3, 1, 8>,
    #[shard(_, _, _, _)] down1b: Tensor<3, 3, 8, 8>,
    #[shard(_, _, _, _)] down2: Tensor<3, 3, 8, 16>,
    #[shard(_, _, _, _)] bottleneck: Tensor<3, 3, 16, 16>,
    #[shard(_, _, _, _)] up2: Tensor<3, 3, 16, 16>,
    #[shard(_, _, _, _)] merge2: Tensor<3, 3, 32, 16>,
    #[shard(_, _, _, _)] up1: Tensor<3, 3, 16, 8>,
    #[shard(_, _, _, _)] merge1: Tensor<3, 3, 16, 8>,
    #[shard(_, _, _, _)] out: Tensor<1, 1, 8, 1>,
) -> Tensor {
    #[shard(data, space, _, _)]
    let skip1 = conv_relu(&conv_relu(&noisy, &down1a), &down1b);
    #[shard(data, space, _, _)]
    let skip2 = conv_relu(&pool(&skip1), &down2);
    #[shard(data, space, _, _)]
    let deep = conv_relu(&pool(&skip2), &bottleneck);
    #[shard(data, space, _, _)]
    let y2 = up(&deep, &skip2, &up2, &merge2);
    #[shard(data, space, _, _)]
    let predicted = up(&y2, &skip1, &up1, &merge1).conv2d(&out, [1, 1], Padding::Valid);
    let error = &predicted - &clean;
    (&error * &error).mean(&[0, 1, 2, 3])
}
