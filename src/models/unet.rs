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

/// The U-Net's convolution kernels (HWIO), replicated, named by field (`down1a`, ..,
/// `out`). Their sizes are fixed: the struct has no shape symbols.
#[crate::params(mesh = (data, space))]
pub struct UNet {
    /// The first down block's first conv.
    #[shard(_, _, _, _)]
    pub down1a: Tensor<3, 3, 1, 8>,
    /// The first down block's second conv.
    #[shard(_, _, _, _)]
    pub down1b: Tensor<3, 3, 8, 8>,
    /// The second down block's conv.
    #[shard(_, _, _, _)]
    pub down2: Tensor<3, 3, 8, 16>,
    /// The bottleneck conv.
    #[shard(_, _, _, _)]
    pub bottleneck: Tensor<3, 3, 16, 16>,
    /// The second up block's conv after upsampling.
    #[shard(_, _, _, _)]
    pub up2: Tensor<3, 3, 16, 16>,
    /// The second up block's conv after joining the skip.
    #[shard(_, _, _, _)]
    pub merge2: Tensor<3, 3, 32, 16>,
    /// The first up block's conv after upsampling.
    #[shard(_, _, _, _)]
    pub up1: Tensor<3, 3, 16, 8>,
    /// The first up block's conv after joining the skip.
    #[shard(_, _, _, _)]
    pub merge1: Tensor<3, 3, 16, 8>,
    /// The 1x1 output conv.
    #[shard(_, _, _, _)]
    pub out: Tensor<1, 1, 8, 1>,
}

/// The denoising loss of the U-Net: the mean squared error of its prediction for
/// `noisy` (NHWC, one channel in and out) against `clean`.
#[crate::model(mesh = (data, space))]
pub fn denoise(
    #[shard(data, space, _, _)] noisy: Tensor<B, H, W, 1>,
    #[shard(data, space, _, _)] clean: Tensor<B, H, W, 1>,
    #[params] p: &UNet,
) -> Tensor {
    #[shard(data, space, _, _)]
    let skip1 = conv_relu(&conv_relu(&noisy, &p.down1a), &p.down1b);
    #[shard(data, space, _, _)]
    let skip2 = conv_relu(&pool(&skip1), &p.down2);
    #[shard(data, space, _, _)]
    let deep = conv_relu(&pool(&skip2), &p.bottleneck);
    #[shard(data, space, _, _)]
    let y2 = up(&deep, &skip2, &p.up2, &p.merge2);
    #[shard(data, space, _, _)]
    let predicted = up(&y2, &skip1, &p.up1, &p.merge1).conv2d(&p.out, [1, 1], Padding::Valid);
    let error = &predicted - &clean;
    (&error * &error).mean(&[0, 1, 2, 3])
}
