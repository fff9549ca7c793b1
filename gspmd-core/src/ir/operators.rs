//! `std::ops` for traced [`Tensor`]s: `a + b`, `&a * 2.0`, `-x`, `a % b` (truncated, as
//! Rust's: [`Tensor::rem`]), with NumPy broadcasting.
//! Each forwards to the method of the same name, so the user's source line is kept.

use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

use super::builder::Tensor;

macro_rules! binary_operator {
    ($($trait:ident $method:ident;)*) => {$(
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<f32> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f32) -> Tensor {
                Tensor::$method(self, &self.scalar_like(f64::from(rhs)))
            }
        }
        impl $trait<f32> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f32) -> Tensor {
                Tensor::$method(&self, &self.scalar_like(f64::from(rhs)))
            }
        }
        impl $trait<&Tensor> for f32 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&rhs.scalar_like(f64::from(self)), rhs)
            }
        }
        impl $trait<Tensor> for f32 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&rhs.scalar_like(f64::from(self)), &rhs)
            }
        }
    )*};
}

binary_operator! {
    Add add;
    Sub sub;
    Mul mul;
    Div div;
    Rem rem;
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}
