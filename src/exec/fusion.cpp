// The fusion pass: finds the node groups of each FusedKind (plan.h lists the roles), checks that the
// intermediates nobody else reads can be dropped and that moving the group's earlier nodes down to
// its last one crosses no conflicting dispatch, asks the backend, and rewrites the plan.
#include <algorithm>
#include <unordered_map>

#include "loom/exec_plan.h"

namespace loom::exec {

namespace {

class Matcher {
 public:
  Matcher(Plan& plan, const Graph& g, const FusionSupport& support)
      : plan_(plan), support_(support), users_(readers_of(g)) {
    for (size_t i = 0; i < plan.dispatches.size(); ++i) at_[plan.dispatches[i].node()] = i;
    dead_.assign(plan.dispatches.size(), false);
  }

  void run() {
    // Longer patterns first, so add_rms_norm_mul wins over the rms_norm_mul inside it.
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_moe_route(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_gather_flash_attn(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_all_reduce_add_rms_norm_mul(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_add_rms_norm_mul(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_rms_norm_mul(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_glu_mat_vec(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_mat_vec_bias(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_mat_vec_multi(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_rope_flash_attn(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_rope_set_rows(i);
    for (size_t i = 0; i < plan_.dispatches.size(); ++i) try_scale_mask_soft_max(i);
    // drop the dispatches folded into fused ones
    std::vector<Dispatch> out;
    out.reserve(plan_.dispatches.size());
    for (size_t i = 0; i < plan_.dispatches.size(); ++i)
      if (!dead_[i]) out.push_back(std::move(plan_.dispatches[i]));
    plan_.dispatches.swap(out);
  }

 private:
  // The users of `t` (nodes reading it directly or through views); outputs count as a user.
  size_t n_users(const Tensor* t) const {
    auto it = users_.find(t);
    return (it == users_.end() ? 0 : it->second.size()) + ((t->flags & kTensorOutput) ? 1 : 0);
  }
  const std::vector<Tensor*>& users(const Tensor* t) const {
    static const std::vector<Tensor*> kNone;
    auto it = users_.find(t);
    return it == users_.end() ? kNone : it->second;
  }
  // Index of the live (unfused) dispatch of node t, or -1.
  long live(const Tensor* t) const {
    auto it = at_.find(t);
    if (it == at_.end()) return -1;
    const size_t i = it->second;
    if (dead_[i] || plan_.dispatches[i].kind != FusedKind::none) return -1;
    return static_cast<long>(i);
  }
  const Tensor* sole_user(const Tensor* t) const {
    return n_users(t) == 1 && !users(t).empty() ? users(t)[0] : nullptr;
  }

  // Builds the fused dispatch from `nodes` (roles), `kept` flags; checks movability; commits.
  bool commit(FusedKind kind, std::array<Tensor*, kMaxFusedNodes> nodes, std::array<bool, kMaxFusedNodes> kept) {
    std::vector<size_t> members;
    for (Tensor* t : nodes) {
      if (!t) continue;
      const long i = live(t);
      if (i < 0) return false;
      members.push_back(static_cast<size_t>(i));
    }
    std::sort(members.begin(), members.end());
    if (std::adjacent_find(members.begin(), members.end()) != members.end()) return false;
    const size_t last = members.back();
    // Every member but the last runs later than before: nothing in between may conflict with it.
    for (size_t m : members) {
      if (m == last) continue;
      for (size_t x = m + 1; x < last; ++x) {
        if (std::binary_search(members.begin(), members.end(), x)) continue;
        if (conflicts(plan_.dispatches[x], plan_.dispatches[m])) return false;
      }
    }
    Dispatch d;
    d.kind = kind;
    d.nodes = nodes;
    d.kept = kept;
    d.order = plan_.dispatches[last].order;
    auto is_dropped = [&](const Tensor* p) {
      for (int r = 0; r < kMaxFusedNodes; ++r)
        if (nodes[r] && nodes[r] == p && !kept[r]) return true;
      return false;
    };
    for (int r = 0; r < kMaxFusedNodes; ++r) {
      Tensor* t = nodes[r];
      if (!t) continue;
      for (const Tensor* s : t->src)
        if (s && !is_dropped(producer(s))) d.reads.push_back(tensor_range(*s));
      if (kept[r]) d.writes.push_back(tensor_range(*t));
      d.barrier = d.barrier || plan_.dispatches[at_.find(t)->second].barrier;  // live() found it
    }
    if (!support_.supports_fused(d)) return false;
    for (size_t m : members)
      if (m != last) dead_[m] = true;
    plan_.dispatches[last] = std::move(d);
    ++plan_.stats.fusions[static_cast<size_t>(kind)];
    return true;
  }

  Tensor* node_at(size_t i) const { return dead_[i] ? nullptr : plan_.dispatches[i].node(); }
  bool is(const Tensor* t, OpKind op) const { return t && t->op == op; }

  // rms_norm -> mul(norm, w)
  bool rms_norm_mul_of(Tensor* norm, Tensor*& mul) const {
    if (!is(norm, OpKind::rms_norm)) return false;
    const Tensor* u = sole_user(norm);
    if (!is(u, OpKind::mul) || u->src[0] != norm || !u->src[1]) return false;
    mul = const_cast<Tensor*>(u);
    return true;
  }

  void try_rms_norm_mul(size_t i) {
    Tensor* norm = node_at(i);
    Tensor* mul = nullptr;
    if (live(norm) < 0 || !rms_norm_mul_of(norm, mul)) return;
    commit(FusedKind::rms_norm_mul, {norm, mul}, {false, true});
  }

  // add -> rms_norm -> mul(norm, w), the norm one of the add's readers: {norm, mul}, or nulls
  std::pair<Tensor*, Tensor*> norm_after(Tensor* add) const {
    for (Tensor* u : users(add)) {
      Tensor* mul = nullptr;
      if (u->src[0] == add && rms_norm_mul_of(u, mul)) return {u, mul};
    }
    return {nullptr, nullptr};
  }

  void try_add_rms_norm_mul(size_t i) {
    Tensor* add = node_at(i);
    if (!is(add, OpKind::add) || live(add) < 0) return;
    if (auto [norm, mul] = norm_after(add); norm)
      commit(FusedKind::add_rms_norm_mul, {add, norm, mul}, {true, false, true});
  }

  // all_reduce -> add (the residual's) -> rms_norm -> mul: tensor parallelism's attention output
  // and FFN down sums, each followed by the next norm.
  void try_all_reduce_add_rms_norm_mul(size_t i) {
    Tensor* ar = node_at(i);
    if (!is(ar, OpKind::all_reduce) || live(ar) < 0) return;
    Tensor* add = const_cast<Tensor*>(sole_user(ar));
    if (!is(add, OpKind::add) || add->src[0] == add->src[1] || (add->src[0] != ar && add->src[1] != ar)) return;
    if (auto [norm, mul] = norm_after(add); norm)
      commit(FusedKind::all_reduce_add_rms_norm_mul, {ar, add, norm, mul}, {false, true, false, true});
  }

  void try_mat_vec_bias(size_t i) {
    Tensor* mm = node_at(i);
    if (!is(mm, OpKind::mul_mat) || live(mm) < 0) return;
    const Tensor* u = sole_user(mm);
    if (!is(u, OpKind::add) || u->src[0] != mm || !u->src[1]) return;
    commit(FusedKind::mat_vec_bias, {mm, const_cast<Tensor*>(u)}, {false, true});
  }

  void try_glu_mat_vec(size_t i) {
    Tensor* glu = node_at(i);
    if (!glu || (glu->op != OpKind::swiglu && glu->op != OpKind::geglu) || live(glu) < 0) return;
    Tensor* gate = glu->src[0];
    Tensor* up = glu->src[1];
    if (!is(gate, OpKind::mul_mat) || !is(up, OpKind::mul_mat) || gate == up) return;
    if (gate->src[1] != up->src[1] || sole_user(gate) != glu || sole_user(up) != glu) return;
    commit(FusedKind::glu_mat_vec, {gate, up, glu}, {false, false, true});
  }

  // mul_mats reading the same activations (Q, K and V of one layer): up to three, nearest first.
  void try_mat_vec_multi(size_t i) {
    Tensor* mm0 = node_at(i);
    if (!is(mm0, OpKind::mul_mat) || live(mm0) < 0) return;
    std::vector<Tensor*> group{mm0};
    for (size_t j = i + 1; j < std::min(plan_.dispatches.size(), i + 8) && group.size() < 3; ++j) {
      Tensor* c = node_at(j);
      // any weight types: the backend says which groups it takes (a prompt pass's dequantizing form
      // takes a Q4_K_M file's q6_K V beside q4_K Q and K; the mat-vecs, one type)
      if (is(c, OpKind::mul_mat) && live(c) >= 0 && c->src[1] == mm0->src[1]) group.push_back(c);
    }
    if (group.size() == 3 &&
        commit(FusedKind::mat_vec_multi, {group[0], group[1], group[2]}, {true, true, true}))
      return;
    // else a pair: (0, 1), (0, 2), (1, 2) (Q and K where V's weights are of another type)
    for (size_t a = 0; a + 1 < group.size(); ++a)
      for (size_t b = a + 1; b < group.size(); ++b)
        if (commit(FusedKind::mat_vec_multi, {group[a], group[b]}, {true, true})) return;
  }

  // The rotated keys' store: sr = set_rows(cache, permute(rope_k)), rope_k read by sr alone; null if
  // `sr` is not one.
  Tensor* rope_of_store(Tensor* sr) const {
    if (!is(sr, OpKind::set_rows) || live(sr) < 0) return nullptr;
    const Tensor* view = sr->src[0];
    if (!is(view, OpKind::view)) return nullptr;
    Tensor* rope_k = view->view_src;
    if (!is(rope_k, OpKind::rope) || sole_user(rope_k) != sr) return nullptr;
    return rope_k;
  }
  // The query's rope beside rope_k: same positions, factors and parameters, nearby.
  Tensor* rope_q_near(Tensor* rope_k) const {
    auto k_it = at_.find(rope_k);
    if (k_it == at_.end()) return nullptr;  // not a node of this plan
    const size_t k_at = k_it->second;
    for (size_t j = k_at >= 6 ? k_at - 6 : 0; j < std::min(plan_.dispatches.size(), k_at + 7); ++j) {
      Tensor* c = node_at(j);
      if (c == rope_k || !is(c, OpKind::rope) || live(c) < 0) continue;
      if (c->src[1] == rope_k->src[1] && c->src[2] == rope_k->src[2] && c->params == rope_k->params &&
          c->type == rope_k->type)
        return c;
    }
    return nullptr;
  }
  // The values' store beside the keys' store sr: a set_rows of the same cells that stores no rope, nearby.
  Tensor* value_store_near(Tensor* sr) const {
    auto sr_it = at_.find(sr);
    if (sr_it == at_.end()) return nullptr;
    const size_t i = sr_it->second;
    for (size_t j = i >= 8 ? i - 8 : 0; j < std::min(plan_.dispatches.size(), i + 9); ++j) {
      Tensor* c = node_at(j);
      if (c == sr || !is(c, OpKind::set_rows) || live(c) < 0 || c->src[1] != sr->src[1] || c->type != sr->type)
        continue;
      const Tensor* src = producer(c->src[0]);
      if (src && src->op == OpKind::rope) continue;
      return c;
    }
    return nullptr;
  }

  // A decode step's attention over the cache it has just stored into: flash_attn whose Q is a view of
  // rope(q) (read by it alone) and whose K and V are views of the two stores of rope_set_rows. The
  // backend takes it where its decode kernel rotates and stores the new row itself.
  void try_rope_flash_attn(size_t i) {
    Tensor* fa = node_at(i);
    if (!is(fa, OpKind::flash_attn) || live(fa) < 0) return;
    Tensor* rope_q = const_cast<Tensor*>(producer(fa->src[0]));
    Tensor* sr = const_cast<Tensor*>(producer(fa->src[1]));
    Tensor* sr_v = const_cast<Tensor*>(producer(fa->src[2]));
    if (!is(rope_q, OpKind::rope) || live(rope_q) < 0 || sole_user(rope_q) != fa) return;
    Tensor* rope_k = rope_of_store(sr);
    if (!rope_k || rope_k == rope_q || rope_q_near(rope_k) != rope_q) return;
    if (value_store_near(sr) != sr_v) return;
    commit(FusedKind::rope_flash_attn, {rope_k, sr, rope_q, sr_v, fa}, {false, true, false, true, true});
  }

  void try_rope_set_rows(size_t i) {
    Tensor* sr = node_at(i);
    Tensor* rope_k = rope_of_store(sr);
    if (!rope_k) return;
    Tensor* rope_q = rope_q_near(rope_k);
    Tensor* sr_v = value_store_near(sr);
    if (rope_q && sr_v &&
        commit(FusedKind::rope_set_rows, {rope_k, sr, rope_q, sr_v}, {false, true, true, true}))
      return;
    if (rope_q && commit(FusedKind::rope_set_rows, {rope_k, sr, rope_q}, {false, true, true})) return;
    commit(FusedKind::rope_set_rows, {rope_k, sr}, {false, true});
  }

  void try_scale_mask_soft_max(size_t i) {
    Tensor* sc = node_at(i);
    if (!is(sc, OpKind::scale) || live(sc) < 0) return;
    const Tensor* add = sole_user(sc);
    if (!is(add, OpKind::add) || add->src[0] != sc || !add->src[1]) return;
    const Tensor* sm = sole_user(add);
    if (!is(sm, OpKind::soft_max) || sm->src[0] != add || sm->src[1]) return;
    commit(FusedKind::scale_mask_soft_max, {sc, const_cast<Tensor*>(add), const_cast<Tensor*>(sm)},
           {false, false, true});
  }

  void try_moe_route(size_t i) {
    Tensor* sm = node_at(i);
    if (!is(sm, OpKind::soft_max) || live(sm) < 0 || sm->src[1]) return;
    Tensor* top_k = nullptr;
    Tensor* get_rows = nullptr;
    for (Tensor* u : users(sm)) {
      if (is(u, OpKind::top_k) && u->src[0] == sm) top_k = u;
      else if (is(u, OpKind::get_rows) && producer(u->src[0]) == sm) get_rows = u;
      else return;  // another reader of the probabilities
    }
    if (!top_k || !get_rows || get_rows->src[1] != top_k || n_users(sm) != 2) return;
    // optional normalisation: div(view(get_rows), sum_rows(view(get_rows)))
    Tensor* sum = nullptr;
    Tensor* div = nullptr;
    const std::vector<Tensor*>& gu = users(get_rows);
    if (gu.size() == 2 && !(get_rows->flags & kTensorOutput)) {
      for (Tensor* u : gu) {
        if (is(u, OpKind::sum_rows) && producer(u->src[0]) == get_rows) sum = u;
        else if (is(u, OpKind::div) && producer(u->src[0]) == get_rows) div = u;
      }
      if (!sum || !div || div->src[1] != sum || sole_user(sum) != div) sum = div = nullptr;
    }
    if (sum && div) {
      commit(FusedKind::moe_route, {sm, top_k, get_rows, sum, div}, {false, true, false, false, true});
      return;
    }
    commit(FusedKind::moe_route, {sm, top_k, get_rows}, {false, true, true});
  }

  // flash_attn over gathered K/V (StepBuilder::attention with shape.gather): K and V are views of
  // get_rows outputs that nothing else reads, so the attention kernel can follow the row indices
  // into the cache store itself instead of reading an f32 copy the gathers wrote. The backend
  // checks the types and shapes (f16 rows, i32 indices, the view a reshape of the whole gather).
  void try_gather_flash_attn(size_t i) {
    Tensor* fa = node_at(i);
    if (!is(fa, OpKind::flash_attn) || live(fa) < 0) return;
    auto gather_of = [&](const Tensor* kv) -> Tensor* {
      if (!is(kv, OpKind::view)) return nullptr;
      Tensor* rows = kv->view_src;
      return is(rows, OpKind::get_rows) && sole_user(rows) == fa ? rows : nullptr;
    };
    Tensor* get_k = gather_of(fa->src[1]);
    Tensor* get_v = gather_of(fa->src[2]);
    if (!get_k || !get_v || get_k == get_v) return;
    commit(FusedKind::gather_flash_attn, {get_k, get_v, fa}, {false, false, true});
  }

  Plan& plan_;
  const FusionSupport& support_;
  std::unordered_map<const Tensor*, size_t> at_;  // node -> its original dispatch
  std::unordered_map<const Tensor*, std::vector<Tensor*>> users_;
  std::vector<bool> dead_;  // per original dispatch: folded into a fused one
};

}  // namespace

void fuse(Plan& plan, const Graph& g, const FusionSupport& support) { Matcher(plan, g, support).run(); }

const Tensor* producer(const Tensor* t) {
  while (t && t->op == OpKind::view) t = t->view_src;
  return t;
}

std::unordered_map<const Tensor*, std::vector<Tensor*>> readers_of(const Graph& g) {
  std::unordered_map<const Tensor*, std::vector<Tensor*>> readers;
  for (Tensor* t : g.nodes()) {
    if (t->op == OpKind::view) {
      // a view the caller reads after compute keeps what it shows alive
      if (t->flags & kTensorOutput) readers[producer(t)].push_back(t);
      continue;
    }
    for (const Tensor* s : t->src) {
      const Tensor* p = producer(s);
      if (p) readers[p].push_back(t);
    }
  }
  return readers;
}

}  // namespace loom::exec
