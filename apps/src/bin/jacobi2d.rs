//! Jacobi2D: `jacobi2d [--grid NX[xNY]] [--block BX[xBY]] [--iters K] [--residual-every R] [--gpu] [--quiet]`.
//! Prints `checksum=<16 hex digits> iterations=<K>` as its last line; with
//! `--gpu` the blocks live on the nodes' GPUs and the checksum is the same.

fn main() {
    // Every node (newcomers too) gets the job's arguments, so every node
    // registers the same way and starts its GPUs before it joins.
    if std::env::args().any(|a| a == "--gpu") {
        ductile::launch(ductile_apps::jacobi::register_gpu)
    } else {
        ductile::launch(ductile_apps::jacobi::register)
    }
}
