//! Jacobi2D: `jacobi2d [--grid NX[xNY]] [--block BX[xBY]] [--iters K] [--residual-every R] [--quiet]`.
//! Prints `checksum=<16 hex digits> iterations=<K>` as its last line.

fn main() {
    ductile::launch(ductile_apps::jacobi::register)
}
