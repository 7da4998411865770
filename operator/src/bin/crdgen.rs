//! Prints the ElasticJob CustomResourceDefinition as YAML.
//!
//! `cargo run -p ductile-operator --bin crdgen > crds/elasticjob.yaml`; the
//! test `crd_is_fresh` fails when the committed file differs.

fn main() {
    print!("{}", ductile_operator::crd::crd_yaml());
}
