//! Topology: everything about PE numbering and spanning trees, derived from one
//! membership [`View`].
//!
//! Every topology-dependent decision in the runtime (which node hosts a PE,
//! which PE is a collection element's home, who is whose parent in the
//! spanning tree) goes through a [`Topology`]. A rescale builds a new one from
//! the new view and hands it to each subsystem's rescale hook; nothing else
//! caches PE counts.

use ductile_coordinator::proto::{Epoch, NodeId, View};

/// A global PE number: prefix sums of the PE counts over the view's ordered members.
pub type Pe = u32;

/// Fan-out of the node-level spanning tree (the rescale's drain tree too).
pub(crate) const TREE_ARITY: u32 = 4;

/// PE numbering and the spanning tree of one view, as seen from one node.
#[derive(Clone, Debug)]
pub struct Topology {
    epoch: Epoch,
    my_node: NodeId,
    /// First global PE of each node, plus a final entry equal to the total.
    first_pe: Vec<Pe>,
    /// Stable member uid of each node (survives renumbering).
    uids: Vec<u64>,
}

impl Topology {
    /// Derives the topology of `view` for the node `my_node`.
    ///
    /// # Panics
    /// If `my_node` is not in the view or a member has zero PEs: both are
    /// coordinator invariants, checked before a view is ever handed out.
    pub fn new(view: &View, my_node: NodeId) -> Self {
        assert!(
            (my_node as usize) < view.members.len(),
            "node {my_node} is not in view epoch {}",
            view.epoch
        );
        let mut first_pe = Vec::with_capacity(view.members.len() + 1);
        let mut next = 0u32;
        for m in &view.members {
            assert!(m.pes > 0, "member {} has no PEs", m.node);
            first_pe.push(next);
            next += m.pes;
        }
        first_pe.push(next);
        Topology {
            epoch: view.epoch,
            my_node,
            first_pe,
            uids: view.members.iter().map(|m| m.uid).collect(),
        }
    }

    /// A single-node topology with `pes` PEs, for programs started without a coordinator.
    pub fn standalone(pes: u32) -> Self {
        assert!(pes > 0, "a node needs at least one PE");
        Topology {
            epoch: 1,
            my_node: 0,
            first_pe: vec![0, pes],
            uids: vec![0],
        }
    }

    /// The view epoch this topology was derived from.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
    /// This node's id in the view.
    pub fn my_node(&self) -> NodeId {
        self.my_node
    }
    /// This node's stable uid.
    pub fn my_uid(&self) -> u64 {
        self.uids[self.my_node as usize]
    }
    /// The coordinator's uid of `node`.
    pub fn uid_of(&self, node: NodeId) -> u64 {
        self.uids[node as usize]
    }
    /// Number of nodes.
    pub fn num_nodes(&self) -> u32 {
        (self.first_pe.len() - 1) as u32
    }
    /// Total number of PEs in the job.
    pub fn num_pes(&self) -> u32 {
        *self.first_pe.last().expect("first_pe is never empty")
    }
    /// First global PE of `node`.
    pub fn first_pe(&self, node: NodeId) -> Pe {
        self.first_pe[node as usize]
    }
    /// Number of PEs on `node`.
    pub fn pes_on(&self, node: NodeId) -> u32 {
        self.first_pe[node as usize + 1] - self.first_pe[node as usize]
    }
    /// Number of PEs on this node.
    pub fn local_pes(&self) -> u32 {
        self.pes_on(self.my_node)
    }
    /// The node hosting `pe`.
    pub fn node_of(&self, pe: Pe) -> NodeId {
        debug_assert!(pe < self.num_pes(), "PE {pe} out of range");
        // first_pe is sorted; the node is the last entry <= pe.
        (self.first_pe.partition_point(|&f| f <= pe) - 1) as NodeId
    }
    /// Rank of `pe` inside its node.
    pub fn rank_of(&self, pe: Pe) -> usize {
        (pe - self.first_pe(self.node_of(pe))) as usize
    }
    /// Whether `pe` lives in this process.
    pub fn is_local(&self, pe: Pe) -> bool {
        pe >= self.first_pe(self.my_node) && pe < self.first_pe(self.my_node + 1)
    }
    /// The global PE of local rank `rank`.
    pub fn local_pe(&self, rank: usize) -> Pe {
        self.first_pe(self.my_node) + rank as u32
    }

    /// Parent of `pe` in the spanning tree (None for the root, PE 0).
    ///
    /// The tree is two-level: a node-level `TREE_ARITY`-ary tree whose vertices
    /// are each node's first PE, and inside each node a star from that first PE
    /// to the node's other PEs. Inter-node hops are thus logarithmic in the
    /// node count, and intra-node fan-out never crosses a socket.
    pub fn parent(&self, pe: Pe) -> Option<Pe> {
        let node = self.node_of(pe);
        let rep = self.first_pe(node);
        if pe != rep {
            return Some(rep);
        }
        if node == 0 {
            return None;
        }
        Some(self.first_pe((node - 1) / TREE_ARITY))
    }

    /// Children of `pe` in the spanning tree, in a fixed order.
    pub fn children(&self, pe: Pe) -> Vec<Pe> {
        let node = self.node_of(pe);
        let rep = self.first_pe(node);
        if pe != rep {
            return Vec::new();
        }
        let mut out: Vec<Pe> = (rep + 1..self.first_pe(node + 1)).collect();
        for c in 1..=TREE_ARITY {
            let child = node * TREE_ARITY + c;
            if child < self.num_nodes() {
                out.push(self.first_pe(child));
            }
        }
        out
    }

    /// Every PE below `pe` in the spanning tree (not `pe` itself).
    pub fn subtree(&self, pe: Pe) -> Vec<Pe> {
        let mut out = Vec::new();
        let mut stack = self.children(pe);
        while let Some(p) = stack.pop() {
            stack.extend(self.children(p));
            out.push(p);
        }
        out
    }

    /// Parent of `node` in the node-level tree (None for node 0).
    pub fn node_parent(&self, node: NodeId) -> Option<NodeId> {
        (node > 0).then(|| (node - 1) / TREE_ARITY)
    }

    /// Children of `node` in the node-level tree.
    pub fn node_children(&self, node: NodeId) -> Vec<NodeId> {
        (1..=TREE_ARITY)
            .map(|c| node * TREE_ARITY + c)
            .filter(|&c| c < self.num_nodes())
            .collect()
    }

    /// Home PE of an element at linear position `lin` of a bulk range of `total`
    /// elements: contiguous blocks, as Charm++'s default block map.
    pub fn block_home(&self, lin: u64, total: u64) -> Pe {
        debug_assert!(lin < total);
        ((lin as u128 * self.num_pes() as u128) / total as u128) as Pe
    }

    /// Home PE of an element outside any bulk range: a stable hash of its key.
    pub fn hash_home(&self, key: u128) -> Pe {
        (mix64((key as u64) ^ mix64((key >> 64) as u64)) % self.num_pes() as u64) as Pe
    }
}

/// SplitMix64 finaliser: a cheap, well-spread, stable 64-bit mix.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ductile_coordinator::proto::Member;
    use proptest::prelude::*;

    fn view(pes: &[u32]) -> View {
        View {
            epoch: 3,
            members: pes
                .iter()
                .enumerate()
                .map(|(i, &p)| Member {
                    node: i as u32,
                    uid: 100 + i as u64,
                    address: vec![],
                    pes: p,
                    host: "h".into(),
                    pid: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn numbering_is_prefix_sums() {
        let t = Topology::new(&view(&[2, 1, 3]), 1);
        assert_eq!(t.num_pes(), 6);
        assert_eq!(t.first_pe(2), 3);
        assert_eq!(t.node_of(0), 0);
        assert_eq!(t.node_of(2), 1);
        assert_eq!(t.node_of(5), 2);
        assert_eq!(t.rank_of(4), 1);
        assert!(t.is_local(2) && !t.is_local(3));
        assert_eq!(t.my_uid(), 101);
    }

    proptest! {
        /// The spanning tree reaches every PE exactly once from PE 0, and parent/children agree.
        #[test]
        fn tree_spans_every_pe_once(pes in proptest::collection::vec(1u32..5, 1..40)) {
            let t = Topology::new(&view(&pes), 0);
            let mut seen = vec![0u32; t.num_pes() as usize];
            let mut stack = vec![0u32];
            while let Some(p) = stack.pop() {
                seen[p as usize] += 1;
                for c in t.children(p) {
                    prop_assert_eq!(t.parent(c), Some(p));
                    stack.push(c);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            prop_assert_eq!(t.parent(0), None);
        }

        /// The block map is monotone, covers every PE when total >= PEs, and balanced to within one.
        #[test]
        fn block_map_is_balanced(npes in 1u32..20, total in 1u64..500) {
            let t = Topology::standalone(npes);
            let mut counts = vec![0u64; npes as usize];
            let mut last = 0;
            for lin in 0..total {
                let h = t.block_home(lin, total);
                prop_assert!(h >= last);
                last = h;
                counts[h as usize] += 1;
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(hi - lo <= 1);
        }
    }
}
