#[gspmd::params(mesh = (data))]
enum Weights {
    One,
}

fn main() {}
