//! Jacobi2D: `jacobi2d [--grid NX[xNY]] [--block BX[xBY]] [--iters K] [--residual-every R] [--lb-every L] [--gpu] [--quiet]`
//! (`jacobi2d --help` for the defaults). Prints `checksum=<16 hex digits>
//! iterations=<K>` as its last line; with `--gpu` the blocks live on the
//! nodes' GPUs and the checksum is the same.

use ductile_apps::jacobi::JacobiArgs;

fn main() {
    // Every node (newcomers too) gets the job's arguments and checks them
    // before it joins, so `--help` and a bad flag answer at once; every
    // node registers the same way and starts its GPUs before it joins.
    let parsed: JacobiArgs = ductile_apps::args::parse_or_exit("jacobi2d");
    if parsed.gpu {
        ductile::launch(ductile_apps::jacobi::register_gpu)
    } else {
        ductile::launch(ductile_apps::jacobi::register)
    }
}
