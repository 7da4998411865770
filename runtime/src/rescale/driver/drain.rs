//! The drain's node tree: the tree the drain's counts travel up and its
//! totals down. Survivors form the node tree of the old view among
//! themselves (node 0 at the root, the topology's arity, old order);
//! leaving nodes hang below them as leaves, dealt round-robin.
//!
//! Why leaves: a leaving node may be killed once the root committed (it
//! is then no member, and nobody is told it was lost). Were it an inner
//! vertex, its subtree would never get the totals and a node the job no
//! longer waits for (a leaving child) or one it does (a survivor) would
//! fail at its deadline while the job goes on. As a leaf, nothing waits
//! on it after it sent its counts up. When nobody leaves (an expansion),
//! the drain tree is the view's node tree.
//!
//! May touch: nothing. Pure.

use ductile_coordinator::proto::NodeId;

use crate::topo::TREE_ARITY;

/// One node's place in the drain tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DrainTree {
    /// Where this node's subtree counts go (None: the root, node 0).
    pub parent: Option<NodeId>,
    /// Whose subtree counts it sums, and to whom the totals go down.
    pub children: Vec<NodeId>,
}

impl DrainTree {
    /// `me`'s place in the drain tree of a view whose node `n` leaves when
    /// `leaving[n]` (node 0 never leaves).
    pub(crate) fn of(me: NodeId, leaving: &[bool]) -> DrainTree {
        let survivors: Vec<NodeId> = (0..leaving.len() as NodeId)
            .filter(|&n| !leaving[n as usize])
            .collect();
        let departing: Vec<NodeId> = (0..leaving.len() as NodeId)
            .filter(|&n| leaving[n as usize])
            .collect();
        let a = TREE_ARITY as usize;
        let s = survivors.len().max(1);
        if let Some(j) = departing.iter().position(|&n| n == me) {
            return DrainTree {
                parent: Some(survivors.get(j % s).copied().unwrap_or(0)),
                children: Vec::new(),
            };
        }
        let i = survivors.iter().position(|&n| n == me).unwrap_or(0);
        let parent = (i > 0).then(|| survivors[(i - 1) / a]);
        let mut children: Vec<NodeId> = (i * a + 1..=i * a + a)
            .filter_map(|c| survivors.get(c).copied())
            .collect();
        children.extend(
            departing
                .iter()
                .enumerate()
                .filter(|(j, _)| j % s == i)
                .map(|(_, &n)| n),
        );
        DrainTree { parent, children }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ductile_coordinator::proto::{Member, View};
    use proptest::prelude::*;

    use super::*;
    use crate::topo::Topology;

    fn view(n: u32) -> View {
        View {
            epoch: 1,
            members: (0..n)
                .map(|i| Member {
                    node: i,
                    uid: 10 + u64::from(i),
                    address: vec![],
                    pes: 1,
                    host: "t".into(),
                    pid: i,
                })
                .collect(),
        }
    }

    #[test]
    fn without_leaving_nodes_it_is_the_views_node_tree() {
        for n in [1u32, 2, 5, 17, 40] {
            let v = view(n);
            for me in 0..n {
                let topo = Arc::new(Topology::new(&v, me));
                let t = DrainTree::of(me, &vec![false; n as usize]);
                assert_eq!(t.parent, topo.node_parent(me), "n {n} me {me}");
                assert_eq!(t.children, topo.node_children(me), "n {n} me {me}");
            }
        }
    }

    #[test]
    fn a_leaving_node_under_a_leaving_node_in_the_view_tree_hangs_below_a_survivor() {
        // Node tree of 6: node 1's children are 5..; 1 and 5 both leave.
        let leaving = [false, true, false, false, false, true];
        assert_eq!(DrainTree::of(5, &leaving).parent, Some(2));
        assert_eq!(DrainTree::of(1, &leaving).parent, Some(0));
        assert!(DrainTree::of(1, &leaving).children.is_empty());
        assert_eq!(DrainTree::of(0, &leaving).children, vec![2, 3, 4, 1]);
        assert_eq!(DrainTree::of(2, &leaving).children, vec![5]);
    }

    proptest! {
        /// Every node but the root has one parent, which lists it as a
        /// child; leaving nodes are leaves under survivors; every node is
        /// reached from the root.
        #[test]
        fn leaving_nodes_are_leaves_of_one_tree(
            picks in proptest::collection::vec(any::<bool>(), 1..40),
        ) {
            let mut leaving = picks;
            leaving[0] = false;
            let n = leaving.len() as NodeId;
            let trees: Vec<DrainTree> = (0..n).map(|me| DrainTree::of(me, &leaving)).collect();
            prop_assert_eq!(trees[0].parent, None);
            for me in 1..n {
                let p = trees[me as usize].parent.expect("a parent");
                prop_assert!(!leaving[p as usize], "node {}'s parent {} leaves", me, p);
                prop_assert!(trees[p as usize].children.contains(&me));
                if leaving[me as usize] {
                    prop_assert!(trees[me as usize].children.is_empty());
                }
            }
            let mut seen = vec![false; n as usize];
            let mut stack = vec![0];
            while let Some(x) = stack.pop() {
                prop_assert!(!seen[x as usize], "node {} reached twice", x);
                seen[x as usize] = true;
                stack.extend(trees[x as usize].children.iter().copied());
            }
            prop_assert!(seen.iter().all(|&s| s));
        }
    }
}
