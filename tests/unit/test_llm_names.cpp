// Named intermediates: every node a model's pass builds carries a llama.cpp-style name
// (blk.N.attn_q, blk.N.ffn_down, result_output), and the names reach plan dumps, DOT output and the
// messages that describe a tensor, without entering the structure key.
#include <map>
#include <set>

#include "loom/exec_plan.h"
#include "llm/llm_kv_cache.h"
#include "llm/llm_model_impl.h"
#include "loom/planner.h"
#include "test_llm_common.h"

namespace loom::llm::testing {
namespace {

class LlmNames : public ModelFiles {
 protected:
  // One pass of `shape` over `n_tokens` tokens, built as the Context builds it (not allocated).
  struct Step {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<detail::ContiguousKvCache> kv;
    Graph g;
    Tensor* out = nullptr;
  };
  std::unique_ptr<Step> build_step(const std::string& shape, int n_tokens) {
    auto s = std::make_unique<Step>();
    s->backend = make_cpu_backend(1);
    auto m = Model::load(model(shape), *s->backend, quiet_load());
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return nullptr;
    s->model = std::move(m.value());
    const detail::ModelImpl& impl = s->model->impl();
    auto kv = detail::ContiguousKvCache::create(impl.hp, 64, s->backend->buffer_type(), nullptr, -1);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    if (!kv.ok()) return nullptr;
    s->kv = std::move(kv.value());
    detail::StepShape shape_of_step{n_tokens, 64, false};
    detail::StepBuilder b(s->g, impl.hp, impl.w, *s->kv, impl.arch->rope_mode(), shape_of_step);
    s->out = impl.arch->build(b);
    EXPECT_TRUE(s->g.status().ok()) << s->g.status().to_string();
    if (s->out) s->g.mark_output(s->out);
    return s;
  }
};

std::set<std::string> names_of(const Graph& g) {
  std::set<std::string> names;
  for (const Tensor* t : g.nodes()) names.insert(t->name);
  return names;
}

TEST_F(LlmNames, EveryNodeOfEveryArchitectureIsNamed) {
  for (const char* shape : {"tiny", "qwen2-tiny", "qwen3-tiny", "qwen3moe-tiny", "gemma2-tiny", "gemma3-tiny"}) {
    SCOPED_TRACE(shape);
    auto s = build_step(shape, 3);
    ASSERT_TRUE(s);
    for (const Tensor* t : s->g.nodes()) {
      EXPECT_FALSE(t->name.empty()) << "node " << t->index << " (" << op_name(t->op) << ") has no name";
      if (t->op != OpKind::view) {
        EXPECT_EQ(t->name.find("(view)"), std::string::npos) << t->name;
      }
    }
    const std::set<std::string> names = names_of(s->g);
    for (const char* want : {"inp_embd", "blk.0.attn_norm", "blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v",
                             "blk.0.attn_q_rope", "blk.0.attn_k_rope", "blk.0.k_cache_store", "blk.0.kqv_out",
                             "blk.0.attn_out", "blk.0.ffn_inp", "blk.0.ffn_norm", "blk.1.ffn_out", "result_norm",
                             "result_output"})
      EXPECT_TRUE(names.count(want)) << want;
    EXPECT_EQ(s->out->name, "result_output");
  }
}

TEST_F(LlmNames, LlamaLayersNameTheirFeedForward) {
  auto s = build_step("tiny", 1);
  ASSERT_TRUE(s);
  const std::set<std::string> names = names_of(s->g);
  for (const char* want : {"blk.0.attn_norm.rms_norm", "blk.0.ffn_gate", "blk.0.ffn_up", "blk.0.ffn_glu",
                           "blk.0.ffn_down", "blk.1.attn_q", "blk.1.ffn_down", "blk.1.ffn_out",
                           "blk.1.kqv_out (view)", "result_norm.rms_norm"})
    EXPECT_TRUE(names.count(want)) << want;
  // one layer's nodes carry that layer's prefix, and each layer builds the same named nodes
  std::map<std::string, int> per_layer;
  for (const std::string& n : names)
    if (n.rfind("blk.", 0) == 0) ++per_layer[n.substr(0, n.find('.', 4))];
  ASSERT_EQ(per_layer.size(), 2u);
  EXPECT_EQ(per_layer["blk.0"], per_layer["blk.1"]);
}

TEST_F(LlmNames, MixtureOfExpertsNamesItsRouting) {
  auto s = build_step("qwen3moe-tiny", 2);
  ASSERT_TRUE(s);
  const std::set<std::string> names = names_of(s->g);
  for (const char* want : {"blk.0.ffn_moe_logits", "blk.0.ffn_moe_probs", "blk.0.ffn_moe_topk",
                           "blk.0.ffn_moe_weights", "blk.0.ffn_moe_gate", "blk.0.ffn_moe_up", "blk.0.ffn_moe_glu",
                           "blk.0.ffn_moe_down", "blk.0.ffn_moe_out", "blk.0.attn_q_norm"})
    EXPECT_TRUE(names.count(want)) << want;
}

// Names show where a node is described: describe() (every validation error), the plan's text dump
// and DOT (LOOM_EXEC_DUMP, loom run --trace); and they stay out of the structure key.
TEST_F(LlmNames, NamesReachDumpsAndMessagesButNotTheKey) {
  auto s = build_step("tiny", 1);
  ASSERT_TRUE(s);
  Tensor* q = nullptr;
  for (Tensor* t : s->g.nodes())
    if (t->name == "blk.0.attn_q") q = t;
  ASSERT_NE(q, nullptr);
  EXPECT_NE(describe(*q).find("blk.0.attn_q"), std::string::npos) << describe(*q);

  // a rejected operand: the graph's error names the tensor
  Graph bad;
  Tensor* w = bad.weight(DType::f32, {7, 3, 1, 1}, "w");
  EXPECT_EQ(mul_mat(bad, w, q), nullptr);
  EXPECT_NE(bad.status().message().find("blk.0.attn_q"), std::string::npos) << bad.status().message();

  auto alloc = allocate_graph(s->g, cpu_buffer_type());
  ASSERT_TRUE(alloc.ok()) << alloc.status().to_string();
  exec::Plan p = exec::build_plan(s->g);
  exec::build_dependencies(p, true);
  const std::string dump = p.dump(), dot = p.dot();
  for (const char* want : {"blk.0.attn_q", "blk.1.ffn_down", "result_output"}) {
    EXPECT_NE(dump.find(want), std::string::npos) << want;
    EXPECT_NE(dot.find(want), std::string::npos) << want;
  }

  const StructureKey named = exec::structure_key(s->g);
  for (Tensor* t : s->g.nodes()) t->name.clear();
  EXPECT_EQ(exec::structure_key(s->g).words, named.words);
}

}  // namespace
}  // namespace loom::llm::testing
