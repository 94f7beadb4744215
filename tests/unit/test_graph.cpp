// Graph builder: op validation errors (code, message naming op, tensors and shapes; first error
// wins; nullptr propagates), node/leaf bookkeeping, topological order, outputs.
#include <gtest/gtest.h>

#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "loom/graph.h"

namespace loom {
namespace {

// Expects `t` to be nullptr, the graph's status to carry `code`, and its message to contain each of
// `parts`; also that the failing op appended no node.
void expect_error(const Graph& g, const Tensor* t, size_t nodes_before, StatusCode code,
                  std::initializer_list<const char*> parts) {
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(g.status().code(), code) << g.status().to_string();
  for (const char* p : parts)
    EXPECT_NE(g.status().message().find(p), std::string::npos)
        << "message lacks \"" << p << "\": " << g.status().message();
  EXPECT_EQ(g.nodes().size(), nodes_before);
}

// Runs `build` (leafs, view helpers, then the op under test) on a fresh graph and checks the error.
// Only the view helpers may have appended nodes: the failing op must not.
template <typename Build>
void check_op_error(StatusCode code, std::initializer_list<const char*> parts, Build build) {
  Graph g;
  Tensor* t = build(g);
  expect_error(g, t, g.nodes().size(), code, parts);
  for (const Tensor* n : g.nodes()) EXPECT_EQ(n->op, OpKind::view) << "a failing op appended " << op_name(n->op);
}

// ---- the example of the brief --------------------------------------------------------------------

TEST(GraphErrors, MulMatShapeMessage) {
  Graph g;
  Tensor* a = g.weight(DType::f32, {64, 32, 1, 1}, "wq");
  Tensor* b = g.input(DType::f32, {48, 5, 1, 1}, "x");
  expect_error(g, mul_mat(g, a, b), 0, StatusCode::shape_mismatch,
               {"mul_mat", "'wq'", "'x'", "[64, 32]", "[48, 5]"});
}

// ---- every op ------------------------------------------------------------------------------------

TEST(GraphErrors, ElementwiseBinary) {
  using BinaryFn = Tensor* (*)(Graph&, Tensor*, Tensor*);
  const std::pair<const char*, BinaryFn> ops[] = {{"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  for (auto [name, fn] : ops) {
    SCOPED_TRACE(name);
    check_op_error(StatusCode::shape_mismatch, {name, "'a'", "'b'", "[8, 4]", "[3, 4]"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {3, 4, 1, 1}, "b"));
    });
    // the broadcast goes one way only: b may not be larger than a
    check_op_error(StatusCode::shape_mismatch, {name, "[8]", "[8, 2]"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 1, 1, 1}, "a"), g.input(DType::f32, {8, 2, 1, 1}, "b"));
    });
    check_op_error(StatusCode::type_mismatch, {name, "'b'", "f16"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f16, {8, 4, 1, 1}, "b"));
    });
    check_op_error(StatusCode::type_mismatch, {name, "'a'", "i32"}, [&](Graph& g) {
      return fn(g, g.input(DType::i32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {8, 4, 1, 1}, "b"));
    });
    check_op_error(StatusCode::invalid_argument, {name, "'a (view)'", "contiguous"}, [&](Graph& g) {
      Tensor* a = transpose(g, g.input(DType::f32, {4, 8, 1, 1}, "a"));
      return fn(g, a, g.input(DType::f32, {8, 4, 1, 1}, "b"));
    });
  }
}

TEST(GraphErrors, Unary) {
  using UnaryFn = Tensor* (*)(Graph&, Tensor*);
  const std::pair<const char*, UnaryFn> ops[] = {
      {"silu", silu},
      {"gelu", gelu},
      {"gelu_erf", gelu_erf},
      {"scale", [](Graph& g, Tensor* a) { return scale(g, a, 2.0f); }},
      {"softcap", [](Graph& g, Tensor* a) { return softcap(g, a, 30.0f); }},
      {"rms_norm", [](Graph& g, Tensor* a) { return rms_norm(g, a, 1e-5f); }},
      {"norm", [](Graph& g, Tensor* a) { return norm(g, a, 1e-5f); }},
      {"soft_max", [](Graph& g, Tensor* a) { return soft_max(g, a, nullptr, 1.0f); }},
  };
  for (auto [name, fn] : ops) {
    SCOPED_TRACE(name);
    check_op_error(StatusCode::type_mismatch, {name, "'h'", "f16"},
                   [&](Graph& g) { return fn(g, g.input(DType::f16, {8, 4, 1, 1}, "h")); });
    check_op_error(StatusCode::type_mismatch, {name, "'q'", "q8_0"},
                   [&](Graph& g) { return fn(g, g.weight(DType::q8_0, {32, 4, 1, 1}, "q")); });
    check_op_error(StatusCode::invalid_argument, {name, "contiguous"}, [&](Graph& g) {
      return fn(g, transpose(g, g.input(DType::f32, {4, 8, 1, 1}, "a")));
    });
  }
  check_op_error(StatusCode::invalid_argument, {"softcap", "'a'"},
                 [](Graph& g) { return softcap(g, g.input(DType::f32, {8, 1, 1, 1}, "a"), 0.0f); });
  check_op_error(StatusCode::invalid_argument, {"softcap"},
                 [](Graph& g) { return softcap(g, g.input(DType::f32, {8, 1, 1, 1}, "a"), -1.0f); });
}

TEST(GraphErrors, Gated) {
  using GatedFn = Tensor* (*)(Graph&, Tensor*, Tensor*);
  const std::pair<const char*, GatedFn> ops[] = {{"swiglu", swiglu}, {"geglu", geglu}};
  for (auto [name, fn] : ops) {
    SCOPED_TRACE(name);
    check_op_error(StatusCode::shape_mismatch, {name, "'gate'", "'up'", "[8, 4]", "[8, 3]"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 4, 1, 1}, "gate"), g.input(DType::f32, {8, 3, 1, 1}, "up"));
    });
    // gated ops do not broadcast
    check_op_error(StatusCode::shape_mismatch, {name, "[8, 4]", "[8]"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 4, 1, 1}, "gate"), g.input(DType::f32, {8, 1, 1, 1}, "up"));
    });
    check_op_error(StatusCode::type_mismatch, {name, "'up'"}, [&](Graph& g) {
      return fn(g, g.input(DType::f32, {8, 4, 1, 1}, "gate"), g.input(DType::bf16, {8, 4, 1, 1}, "up"));
    });
  }
}

TEST(GraphErrors, Reductions) {
  check_op_error(StatusCode::type_mismatch, {"sum_rows", "'a'"},
                 [](Graph& g) { return sum_rows(g, g.input(DType::i32, {8, 4, 1, 1}, "a")); });
  check_op_error(StatusCode::type_mismatch, {"argmax", "'a'"},
                 [](Graph& g) { return argmax(g, g.input(DType::f16, {8, 4, 1, 1}, "a")); });
  check_op_error(StatusCode::type_mismatch, {"top_k", "'a'"},
                 [](Graph& g) { return top_k(g, g.input(DType::i32, {8, 4, 1, 1}, "a"), 2); });
  check_op_error(StatusCode::invalid_argument, {"top_k", "'a'", "k = 9"},
                 [](Graph& g) { return top_k(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), 9); });
  check_op_error(StatusCode::invalid_argument, {"top_k", "k = 0"},
                 [](Graph& g) { return top_k(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), 0); });
}

TEST(GraphErrors, GetRows) {
  check_op_error(StatusCode::type_mismatch, {"get_rows", "'idx'", "f32"}, [](Graph& g) {
    return get_rows(g, g.weight(DType::f32, {8, 10, 1, 1}, "emb"), g.input(DType::f32, {3, 1, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::shape_mismatch, {"get_rows", "'emb'", "'idx'", "[8, 10, 2]", "[3, 3]"}, [](Graph& g) {
    return get_rows(g, g.weight(DType::f32, {8, 10, 2, 1}, "emb"), g.input(DType::i32, {3, 3, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::invalid_argument, {"get_rows", "contiguous"}, [](Graph& g) {
    return get_rows(g, transpose(g, g.weight(DType::f32, {10, 8, 1, 1}, "emb")),
                    g.input(DType::i32, {3, 1, 1, 1}, "idx"));
  });
}

TEST(GraphErrors, MulMat) {
  check_op_error(StatusCode::type_mismatch, {"mul_mat", "'x'", "f16"}, [](Graph& g) {
    return mul_mat(g, g.weight(DType::f32, {64, 32, 1, 1}, "w"), g.input(DType::f16, {64, 5, 1, 1}, "x"));
  });
  check_op_error(StatusCode::type_mismatch, {"mul_mat", "'w'", "i32"}, [](Graph& g) {
    return mul_mat(g, g.weight(DType::i32, {64, 32, 1, 1}, "w"), g.input(DType::f32, {64, 5, 1, 1}, "x"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat", "'w'", "'x'", "[64, 32, 3]", "[64, 5, 4]"}, [](Graph& g) {
    return mul_mat(g, g.weight(DType::f32, {64, 32, 3, 1}, "w"), g.input(DType::f32, {64, 5, 4, 1}, "x"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat", "[64, 32, 1, 2]", "[64, 5, 1, 3]"}, [](Graph& g) {
    return mul_mat(g, g.weight(DType::f32, {64, 32, 1, 2}, "w"), g.input(DType::f32, {64, 5, 1, 3}, "x"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat", "q4_0", "[64, 32]", "[32, 5]"}, [](Graph& g) {
    return mul_mat(g, g.weight(DType::q4_0, {64, 32, 1, 1}, "w"), g.input(DType::f32, {32, 5, 1, 1}, "x"));
  });
  check_op_error(StatusCode::invalid_argument, {"mul_mat", "contiguous"}, [](Graph& g) {
    return mul_mat(g, transpose(g, g.weight(DType::f32, {32, 64, 1, 1}, "w")),
                   g.input(DType::f32, {64, 5, 1, 1}, "x"));
  });
}

TEST(GraphErrors, MulMatId) {
  auto experts = [](Graph& g) { return g.weight(DType::f32, {64, 32, 8, 1}, "experts"); };
  check_op_error(StatusCode::type_mismatch, {"mul_mat_id", "'ids'"}, [&](Graph& g) {
    return mul_mat_id(g, experts(g), g.input(DType::f32, {64, 2, 5, 1}, "x"), g.input(DType::f32, {2, 5, 1, 1}, "ids"));
  });
  check_op_error(StatusCode::type_mismatch, {"mul_mat_id", "'x'"}, [&](Graph& g) {
    return mul_mat_id(g, experts(g), g.input(DType::f16, {64, 2, 5, 1}, "x"), g.input(DType::i32, {2, 5, 1, 1}, "ids"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat_id", "'experts'", "'x'", "[64, 32, 8]", "[48, 2, 5]"},
                 [&](Graph& g) {
                   return mul_mat_id(g, experts(g), g.input(DType::f32, {48, 2, 5, 1}, "x"),
                                     g.input(DType::i32, {2, 5, 1, 1}, "ids"));
                 });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat_id", "'x'", "'ids'", "[64, 2, 5]", "[2, 4]"}, [&](Graph& g) {
    return mul_mat_id(g, experts(g), g.input(DType::f32, {64, 2, 5, 1}, "x"), g.input(DType::i32, {2, 4, 1, 1}, "ids"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat_id", "'x'", "'ids'", "[64, 3, 5]", "[2, 5]"}, [&](Graph& g) {
    return mul_mat_id(g, experts(g), g.input(DType::f32, {64, 3, 5, 1}, "x"), g.input(DType::i32, {2, 5, 1, 1}, "ids"));
  });
  check_op_error(StatusCode::shape_mismatch, {"mul_mat_id", "'experts'"}, [&](Graph& g) {
    return mul_mat_id(g, g.weight(DType::f32, {64, 32, 8, 2}, "experts"), g.input(DType::f32, {64, 2, 5, 1}, "x"),
                      g.input(DType::i32, {2, 5, 1, 1}, "ids"));
  });
}

RopeParams rope_params(int n_dims) {
  RopeParams p{};
  p.n_dims = n_dims;
  p.mode = RopeMode::neox;
  p.n_ctx_orig = 4096;
  p.freq_base = 10000.0f;
  p.freq_scale = 1.0f;
  p.attn_factor = 1.0f;
  return p;
}

TEST(GraphErrors, Rope) {
  auto q = [](Graph& g) { return g.input(DType::f32, {64, 8, 5, 1}, "q"); };
  check_op_error(StatusCode::type_mismatch, {"rope", "'pos'"}, [&](Graph& g) {
    return rope(g, q(g), g.input(DType::f32, {5, 1, 1, 1}, "pos"), nullptr, rope_params(64));
  });
  check_op_error(StatusCode::type_mismatch, {"rope", "'q'"}, [&](Graph& g) {
    return rope(g, g.input(DType::f16, {64, 8, 5, 1}, "q"), g.input(DType::i32, {5, 1, 1, 1}, "pos"), nullptr,
                rope_params(64));
  });
  check_op_error(StatusCode::shape_mismatch, {"rope", "'q'", "'pos'", "[64, 8, 5]", "[4]"}, [&](Graph& g) {
    return rope(g, q(g), g.input(DType::i32, {4, 1, 1, 1}, "pos"), nullptr, rope_params(64));
  });
  for (int n_dims : {0, 63, 66, -2}) {
    check_op_error(StatusCode::invalid_argument, {"rope", "n_dims"}, [&](Graph& g) {
      return rope(g, q(g), g.input(DType::i32, {5, 1, 1, 1}, "pos"), nullptr, rope_params(n_dims));
    });
  }
  check_op_error(StatusCode::invalid_argument, {"rope", "mode"}, [&](Graph& g) {
    RopeParams p = rope_params(64);
    p.mode = static_cast<RopeMode>(1);
    return rope(g, q(g), g.input(DType::i32, {5, 1, 1, 1}, "pos"), nullptr, p);
  });
  check_op_error(StatusCode::shape_mismatch, {"rope", "'freqs'", "[16]"}, [&](Graph& g) {
    return rope(g, q(g), g.input(DType::i32, {5, 1, 1, 1}, "pos"), g.weight(DType::f32, {16, 1, 1, 1}, "freqs"),
                rope_params(64));
  });
  check_op_error(StatusCode::type_mismatch, {"rope", "'freqs'"}, [&](Graph& g) {
    return rope(g, q(g), g.input(DType::i32, {5, 1, 1, 1}, "pos"), g.weight(DType::f16, {32, 1, 1, 1}, "freqs"),
                rope_params(64));
  });
}

TEST(GraphErrors, SoftMaxMask) {
  check_op_error(StatusCode::type_mismatch, {"soft_max", "'mask'"}, [](Graph& g) {
    return soft_max(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::i32, {8, 4, 1, 1}, "mask"), 1.0f);
  });
  check_op_error(StatusCode::shape_mismatch, {"soft_max", "'mask'", "[7, 4]"}, [](Graph& g) {
    return soft_max(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {7, 4, 1, 1}, "mask"), 1.0f);
  });
  check_op_error(StatusCode::shape_mismatch, {"soft_max", "'mask'", "[8, 3]"}, [](Graph& g) {
    return soft_max(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f16, {8, 3, 1, 1}, "mask"), 1.0f);
  });
}

TEST(GraphErrors, FlashAttn) {
  auto k = [](Graph& g) { return g.input(DType::f16, {64, 10, 2, 1}, "k"); };
  auto v = [](Graph& g) { return g.input(DType::f16, {64, 10, 2, 1}, "v"); };
  check_op_error(StatusCode::type_mismatch, {"flash_attn", "'q'"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f16, {64, 5, 8, 1}, "q"), k(g), v(g), nullptr, 0.125f);
  });
  check_op_error(StatusCode::type_mismatch, {"flash_attn", "'k'"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), g.input(DType::q8_0, {64, 10, 2, 1}, "k"), v(g),
                      nullptr, 0.125f);
  });
  check_op_error(StatusCode::shape_mismatch, {"flash_attn", "'q'", "'k'", "[32, 5, 8]", "[64, 10, 2]"},
                 [&](Graph& g) {
                   return flash_attn(g, g.input(DType::f32, {32, 5, 8, 1}, "q"), k(g), v(g), nullptr, 0.125f);
                 });
  check_op_error(StatusCode::shape_mismatch, {"flash_attn", "'k'", "'v'", "[64, 10, 2]", "[64, 9, 2]"},
                 [&](Graph& g) {
                   return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), k(g),
                                     g.input(DType::f16, {64, 9, 2, 1}, "v"), nullptr, 0.125f);
                 });
  check_op_error(StatusCode::shape_mismatch, {"flash_attn", "[64, 5, 7]"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 7, 1}, "q"), k(g), v(g), nullptr, 0.125f);
  });
  check_op_error(StatusCode::invalid_argument, {"flash_attn", "softcap"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), k(g), v(g), nullptr, 0.125f, -1.0f);
  });
  check_op_error(StatusCode::shape_mismatch, {"flash_attn", "'mask'", "[10, 4]"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), k(g), v(g),
                      g.input(DType::f16, {10, 4, 1, 1}, "mask"), 0.125f);
  });
  // sinks: f32, one per query head
  check_op_error(StatusCode::type_mismatch, {"flash_attn", "'sinks'", "f32"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), k(g), v(g), nullptr, 0.125f, 0.0f,
                      g.input(DType::f16, {8, 1, 1, 1}, "sinks"));
  });
  check_op_error(StatusCode::shape_mismatch, {"flash_attn", "'sinks'", "[2]"}, [&](Graph& g) {
    return flash_attn(g, g.input(DType::f32, {64, 5, 8, 1}, "q"), k(g), v(g), nullptr, 0.125f, 0.0f,
                      g.input(DType::f32, {2, 1, 1, 1}, "sinks"));
  });
  Graph ok;
  Tensor* sinks = ok.input(DType::f32, {8, 1, 1, 1}, "sinks");
  Tensor* out =
      flash_attn(ok, ok.input(DType::f32, {64, 5, 8, 1}, "q"), k(ok), v(ok), nullptr, 0.125f, 0.0f, sinks);
  ASSERT_NE(out, nullptr) << ok.status().to_string();
  EXPECT_EQ(out->src[4], sinks);
}

TEST(GraphErrors, SwigluOai) {
  auto in = [](Graph& g, const char* name) { return g.input(DType::f32, {8, 4, 1, 1}, name); };
  check_op_error(StatusCode::invalid_argument, {"swiglu_oai", "limit", "'gate'"},
                 [&](Graph& g) { return swiglu_oai(g, in(g, "gate"), in(g, "up"), 1.702f, 0.0f); });
  check_op_error(StatusCode::shape_mismatch, {"swiglu_oai", "'gate'", "'up'"}, [&](Graph& g) {
    return swiglu_oai(g, in(g, "gate"), g.input(DType::f32, {8, 3, 1, 1}, "up"), 1.702f, 7.0f);
  });
  Graph ok;
  Tensor* t = swiglu_oai(ok, in(ok, "gate"), in(ok, "up"), 1.702f, 7.0f);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->op, OpKind::swiglu_oai);
  EXPECT_FLOAT_EQ(t->get_params<SwigluOaiParams>().limit, 7.0f);
}

TEST(GraphErrors, SetRows) {
  auto cache = [](Graph& g) { return g.new_tensor(DType::f16, {64, 100, 2, 1}, "cache"); };
  check_op_error(StatusCode::type_mismatch, {"set_rows", "'src'"}, [&](Graph& g) {
    return set_rows(g, cache(g), g.input(DType::f16, {64, 3, 2, 1}, "src"), g.input(DType::i32, {3, 1, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::type_mismatch, {"set_rows", "'idx'"}, [&](Graph& g) {
    return set_rows(g, cache(g), g.input(DType::f32, {64, 3, 2, 1}, "src"), g.input(DType::f32, {3, 1, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::type_mismatch, {"set_rows", "'cache'"}, [&](Graph& g) {
    return set_rows(g, g.new_tensor(DType::i32, {64, 100, 2, 1}, "cache"), g.input(DType::f32, {64, 3, 2, 1}, "src"),
                    g.input(DType::i32, {3, 1, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::shape_mismatch, {"set_rows", "'cache'", "'src'", "[64, 100, 2]", "[32, 3, 2]"},
                 [&](Graph& g) {
                   return set_rows(g, cache(g), g.input(DType::f32, {32, 3, 2, 1}, "src"),
                                   g.input(DType::i32, {3, 1, 1, 1}, "idx"));
                 });
  check_op_error(StatusCode::shape_mismatch, {"set_rows", "'src'", "'idx'", "[64, 3, 2]", "[4]"}, [&](Graph& g) {
    return set_rows(g, cache(g), g.input(DType::f32, {64, 3, 2, 1}, "src"), g.input(DType::i32, {4, 1, 1, 1}, "idx"));
  });
  check_op_error(StatusCode::shape_mismatch, {"set_rows", "[3, 3]"}, [&](Graph& g) {
    return set_rows(g, cache(g), g.input(DType::f32, {64, 3, 2, 1}, "src"), g.input(DType::i32, {3, 3, 1, 1}, "idx"));
  });
}

TEST(GraphErrors, CpyConvertCont) {
  check_op_error(StatusCode::shape_mismatch, {"cpy", "'a'", "'b'", "[8, 4]", "[8, 3]"}, [](Graph& g) {
    return cpy(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.new_tensor(DType::f32, {8, 3, 1, 1}, "b"));
  });
  check_op_error(StatusCode::type_mismatch, {"cpy", "'a'", "'b'", "i32"}, [](Graph& g) {
    return cpy(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.new_tensor(DType::i32, {8, 4, 1, 1}, "b"));
  });
  check_op_error(StatusCode::type_mismatch, {"cpy", "'a'", "'b'", "i32"}, [](Graph& g) {
    return cpy(g, g.input(DType::i32, {8, 4, 1, 1}, "a"), g.new_tensor(DType::f16, {8, 4, 1, 1}, "b"));
  });
  check_op_error(StatusCode::invalid_argument, {"cpy", "'b'"}, [](Graph& g) {
    // 40-element rows cannot be quantized to whole 32-element blocks
    return cpy(g, g.input(DType::f32, {40, 8, 1, 1}, "a"), g.new_tensor(DType::q8_0, {320, 1, 1, 1}, "b"));
  });
  check_op_error(StatusCode::shape_mismatch, {"convert", "'a'", "q8_0"},
                 [](Graph& g) { return convert(g, g.input(DType::f32, {40, 1, 1, 1}, "a"), DType::q8_0); });
  check_op_error(StatusCode::type_mismatch, {"convert", "'a'"},
                 [](Graph& g) { return convert(g, g.input(DType::f32, {8, 1, 1, 1}, "a"), DType::i32); });
}

TEST(GraphErrors, Concat) {
  check_op_error(StatusCode::invalid_argument, {"concat", "dim 4"}, [](Graph& g) {
    return concat(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {8, 4, 1, 1}, "b"), 4);
  });
  check_op_error(StatusCode::invalid_argument, {"concat", "dim -1"}, [](Graph& g) {
    return concat(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {8, 4, 1, 1}, "b"), -1);
  });
  check_op_error(StatusCode::shape_mismatch, {"concat", "'a'", "'b'", "[8, 4]", "[8, 3]"}, [](Graph& g) {
    return concat(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f32, {8, 3, 1, 1}, "b"), 0);
  });
  check_op_error(StatusCode::type_mismatch, {"concat", "'a'", "'b'", "f16"}, [](Graph& g) {
    return concat(g, g.input(DType::f32, {8, 4, 1, 1}, "a"), g.input(DType::f16, {8, 4, 1, 1}, "b"), 1);
  });
  check_op_error(StatusCode::type_mismatch, {"concat", "'a'", "q8_0"}, [](Graph& g) {
    return concat(g, g.weight(DType::q8_0, {32, 4, 1, 1}, "a"), g.weight(DType::q8_0, {32, 4, 1, 1}, "b"), 1);
  });
}

TEST(GraphErrors, NewTensor) {
  Graph g;
  expect_error(g, g.input(DType::f32, {8, 0, 1, 1}, "z"), 0, StatusCode::shape_mismatch, {"'z'", "dimension 1"});
  Graph g2;
  expect_error(g2, g2.weight(DType::q4_0, {40, 2, 1, 1}, "w"), 0, StatusCode::shape_mismatch, {"'w'", "40", "q4_0"});
  EXPECT_TRUE(g2.leafs().empty());
  Graph g3;
  expect_error(g3, g3.weight(DType::q6_k, {256, -1, 1, 1}, "w"), 0, StatusCode::shape_mismatch, {"'w'"});
}

// ---- propagation ---------------------------------------------------------------------------------

TEST(GraphErrors, FirstErrorWins) {
  Graph g;
  Tensor* w = g.weight(DType::f32, {64, 32, 1, 1}, "w");
  Tensor* x = g.input(DType::f32, {48, 5, 1, 1}, "x");
  Tensor* y = g.input(DType::f32, {7, 3, 1, 1}, "y");
  EXPECT_EQ(mul_mat(g, w, x), nullptr);
  const std::string first = g.status().message();
  EXPECT_EQ(add(g, x, y), nullptr);          // shape error of its own
  EXPECT_EQ(silu(g, g.input(DType::i32, {4, 1, 1, 1}, "i")), nullptr);  // type error of its own
  EXPECT_EQ(g.status().code(), StatusCode::shape_mismatch);
  EXPECT_EQ(g.status().message(), first);
  EXPECT_NE(first.find("mul_mat"), std::string::npos);
  // Valid ops still build after an error; the graph stays failed.
  Tensor* ok = silu(g, x);
  EXPECT_NE(ok, nullptr);
  EXPECT_EQ(g.status().message(), first);
}

TEST(GraphErrors, NullOperandsPropagateWithoutOverwriting) {
  Graph g;
  Tensor* x = g.input(DType::f32, {64, 4, 1, 1}, "x");
  Tensor* pos = g.input(DType::i32, {4, 1, 1, 1}, "pos");
  Tensor* idx = g.input(DType::i32, {4, 1, 1, 1}, "idx");
  Tensor* dst = g.new_tensor(DType::f32, {64, 8, 1, 1}, "dst");
  Tensor* bad = mul_mat(g, x, g.input(DType::f32, {32, 2, 1, 1}, "y"));
  ASSERT_EQ(bad, nullptr);
  const Status first = g.status();
  const size_t nodes = g.nodes().size();
  std::vector<Tensor*> results = {
      view(g, bad, {64, 1, 1, 1}, {0, 256, 256, 256}, 0),
      reshape(g, bad, {256, 1, 1, 1}),
      permute(g, bad, 1, 0, 2, 3),
      transpose(g, bad),
      cont(g, bad),
      get_rows(g, bad, idx),
      get_rows(g, x, nullptr),
      add(g, bad, x),
      sub(g, x, bad),
      mul(g, bad, bad),
      div(g, x, bad),
      scale(g, bad, 2.0f),
      rms_norm(g, bad, 1e-6f),
      norm(g, bad, 1e-6f),
      mul_mat(g, bad, x),
      mul_mat(g, x, bad),
      mul_mat_id(g, bad, x, idx),
      rope(g, bad, pos, nullptr, rope_params(64)),
      rope(g, x, nullptr, nullptr, rope_params(64)),
      soft_max(g, bad, nullptr, 1.0f),
      flash_attn(g, bad, x, x, nullptr, 1.0f),
      flash_attn(g, x, x, bad, nullptr, 1.0f),
      silu(g, bad),
      gelu(g, bad),
      gelu_erf(g, bad),
      swiglu(g, bad, x),
      geglu(g, x, bad),
      softcap(g, bad, 1.0f),
      softcap(g, bad, -1.0f),  // invalid cap, but the null operand comes first
      argmax(g, bad),
      top_k(g, bad, 1),
      set_rows(g, dst, bad, idx),
      set_rows(g, bad, x, idx),
      cpy(g, bad, dst),
      cpy(g, x, bad),
      convert(g, bad, DType::f16),
      concat(g, bad, x, 0),
      concat(g, x, bad, 0),
      sum_rows(g, bad),
  };
  for (size_t i = 0; i < results.size(); ++i) EXPECT_EQ(results[i], nullptr) << "call " << i;
  EXPECT_EQ(g.status().code(), first.code());
  EXPECT_EQ(g.status().message(), first.message());
  EXPECT_EQ(g.nodes().size(), nodes);
  g.mark_output(bad);  // a no-op, not a crash
  EXPECT_TRUE(g.outputs().empty());
}

// ---- bookkeeping ---------------------------------------------------------------------------------

// Checks leafs/nodes indexes and that every operand of node i is a leaf or an earlier node.
void expect_topological(const Graph& g) {
  const auto& leafs = g.leafs();
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < leafs.size(); ++i) {
    EXPECT_TRUE(leafs[i]->is_leaf());
    EXPECT_EQ(leafs[i]->index, static_cast<int32_t>(i));
    EXPECT_EQ(leafs[i]->view_src, nullptr);
  }
  auto check_operand = [&](const Tensor* s, size_t i) {
    if (s->is_leaf()) {
      ASSERT_GE(s->index, 0);
      ASSERT_LT(static_cast<size_t>(s->index), leafs.size());
      EXPECT_EQ(leafs[s->index], s);
    } else {
      ASSERT_GE(s->index, 0);
      EXPECT_LT(static_cast<size_t>(s->index), i) << "node " << i << " reads a later node";
      EXPECT_EQ(nodes[s->index], s);
    }
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Tensor* t = nodes[i];
    EXPECT_FALSE(t->is_leaf());
    EXPECT_EQ(t->index, static_cast<int32_t>(i));
    for (const Tensor* s : t->src)
      if (s) check_operand(s, i);
    if (t->view_src) check_operand(t->view_src, i);
  }
}

TEST(GraphStructure, LeafsAndNodes) {
  Graph g;
  Tensor* x = g.input(DType::f32, {16, 4, 1, 1}, "x");
  Tensor* w = g.weight(DType::f32, {16, 8, 1, 1}, "w");
  Tensor* cache = g.new_tensor(DType::f16, {16, 10, 1, 1}, "cache");
  Tensor* idx = g.input(DType::i32, {4, 1, 1, 1}, "idx");
  Tensor* n = rms_norm(g, x, 1e-6f);
  Tensor* y = mul_mat(g, w, n);
  Tensor* s = set_rows(g, cache, n, idx);
  Tensor* t = transpose(g, y);
  Tensor* c = cont(g, t);
  ASSERT_TRUE(g.status().ok()) << g.status().to_string();
  EXPECT_EQ(g.leafs(), (std::vector<Tensor*>{x, w, cache, idx}));
  EXPECT_EQ(g.nodes(), (std::vector<Tensor*>{n, y, s, t, c}));
  EXPECT_EQ(x->flags, static_cast<uint32_t>(kTensorInput));
  EXPECT_EQ(w->flags, static_cast<uint32_t>(kTensorWeight));
  EXPECT_EQ(cache->flags, 0u);
  EXPECT_EQ(n->op, OpKind::rms_norm);
  EXPECT_FLOAT_EQ(n->get_params<NormParams>().eps, 1e-6f);
  EXPECT_EQ(n->src[0], x);
  EXPECT_EQ(y->op, OpKind::mul_mat);
  EXPECT_EQ(y->ne, (Shape{8, 4, 1, 1}));
  EXPECT_EQ(y->src[0], w);
  EXPECT_EQ(y->src[1], n);
  // set_rows returns a view of its destination that carries the write
  EXPECT_EQ(s->op, OpKind::set_rows);
  EXPECT_EQ(s->view_src, cache);
  EXPECT_EQ(s->type, DType::f16);
  EXPECT_EQ(s->ne, cache->ne);
  EXPECT_EQ(s->nb, cache->nb);
  EXPECT_EQ(s->root(), cache);
  EXPECT_EQ(t->op, OpKind::view);
  EXPECT_EQ(c->op, OpKind::cpy);
  EXPECT_EQ(c->view_src, nullptr);
  EXPECT_TRUE(c->is_contiguous());
  expect_topological(g);
}

TEST(GraphStructure, RandomGraphsAreTopological) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 50; ++trial) {
    Graph g;
    std::vector<Tensor*> pool;
    for (int i = 0; i < 3; ++i) pool.push_back(g.input(DType::f32, {16, 4, 1, 1}, "in" + std::to_string(i)));
    Tensor* w = g.weight(DType::f32, {16, 16, 1, 1}, "w");
    auto pick = [&] { return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]; };
    for (int step = 0; step < 40; ++step) {
      Tensor* r = nullptr;
      switch (std::uniform_int_distribution<int>(0, 6)(rng)) {
        case 0: r = add(g, pick(), pick()); break;
        case 1: r = silu(g, pick()); break;
        case 2: r = rms_norm(g, pick(), 1e-5f); break;
        case 3: r = mul_mat(g, w, pick()); break;  // [16, 4] again
        case 4: r = reshape(g, pick(), {64, 1, 1, 1}); r = reshape(g, r, {16, 4, 1, 1}); break;
        case 5: r = cont(g, transpose(g, cont(g, transpose(g, pick())))); break;
        case 6: r = swiglu(g, pick(), pick()); break;
      }
      ASSERT_NE(r, nullptr) << g.status().to_string();
      pool.push_back(r);
    }
    ASSERT_TRUE(g.status().ok());
    expect_topological(g);
    EXPECT_EQ(g.leafs().size(), 4u);
  }
}

TEST(GraphStructure, MarkOutput) {
  Graph g;
  Tensor* x = g.input(DType::f32, {8, 1, 1, 1}, "x");
  Tensor* a = silu(g, x);
  Tensor* b = scale(g, a, 3.0f, 1.0f);
  EXPECT_TRUE(g.outputs().empty());
  EXPECT_EQ(a->flags & kTensorOutput, 0u);
  g.mark_output(b);
  g.mark_output(a);
  g.mark_output(b);  // no duplicate
  g.mark_output(x);  // a leaf may be an output too
  g.mark_output(nullptr);
  EXPECT_EQ(g.outputs(), (std::vector<Tensor*>{b, a, x}));
  EXPECT_NE(b->flags & kTensorOutput, 0u);
  EXPECT_NE(a->flags & kTensorOutput, 0u);
  EXPECT_EQ(x->flags, static_cast<uint32_t>(kTensorInput | kTensorOutput));
  EXPECT_FLOAT_EQ(b->get_params<ScaleParams>().scale, 3.0f);
  EXPECT_FLOAT_EQ(b->get_params<ScaleParams>().bias, 1.0f);
}

TEST(GraphStructure, OutputShapesOfOps) {
  Graph g;
  Tensor* x = g.input(DType::f32, {16, 4, 3, 1}, "x");
  Tensor* k = g.input(DType::f16, {16, 10, 1, 1}, "k");
  Tensor* v = g.input(DType::f16, {24, 10, 1, 1}, "v");
  Tensor* q = g.input(DType::f32, {16, 5, 3, 1}, "q");
  EXPECT_EQ(sum_rows(g, x)->ne, (Shape{1, 4, 3, 1}));
  Tensor* am = argmax(g, x);
  EXPECT_EQ(am->ne, (Shape{4, 3, 1, 1}));
  EXPECT_EQ(am->type, DType::i32);
  Tensor* tk = top_k(g, x, 5);
  EXPECT_EQ(tk->ne, (Shape{5, 4, 3, 1}));
  EXPECT_EQ(tk->get_params<TopKParams>().k, 5);
  EXPECT_EQ(concat(g, x, x, 2)->ne, (Shape{16, 4, 6, 1}));
  EXPECT_EQ(concat(g, x, x, 0)->get_params<ConcatParams>().dim, 0);
  // flash_attn -> [dv, n_head, n_q]
  EXPECT_EQ(flash_attn(g, q, k, v, nullptr, 0.25f)->ne, (Shape{24, 3, 5, 1}));
  Tensor* h = convert(g, x, DType::f16);
  EXPECT_EQ(h->type, DType::f16);
  EXPECT_EQ(h->ne, x->ne);
  EXPECT_TRUE(g.status().ok()) << g.status().to_string();
}

}  // namespace
}  // namespace loom
