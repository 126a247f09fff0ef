// The options every decoder-only transformer family shares, bound once (option_binding.hpp).
//
// A family's options struct extends DecoderOptions (gpt2) or RotaryDecoderOptions (llama,
// gemma), and its schema is a DecoderSchema: the shared options are one call each, whose name,
// type, field and range are written here; the family gives the default and the one-line doc where
// they differ between families, and places each option where its schema lists it:
//
//   struct Gpt2Options : loom::models::DecoderOptions {
//     std::int64_t mlp_scale;
//     ...
//   };
//
//   loom::models::DecoderSchema<Gpt2Options> s;
//   s.seq_len(1024, "Longest sequence: the number of learned positions.");
//   s.hidden_dim(768, "Width of the residual stream (n_embd).");
//   ...
//   s.field("mlp_scale", &Gpt2Options::mlp_scale, 4, "MLP width as a multiple of hidden_dim.").min(1).max(1024);
//   ...
//   s.vocab_size();
//   s.remat();
//   s.attention();
//   s.then([](Gpt2Options& o, const loom::Options&) { ... checks of combinations ... });
//
// `path` is set first (options_path: "model"), so then() steps can name the options in messages.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>

#include "loom/autograd.hpp"
#include "loom/model_support.hpp"
#include "loom/option_binding.hpp"
#include "loom/options.hpp"
#include "loom/transformer_blocks.hpp"

namespace loom::models {

// What every decoder family has: its extents, initialisation, norm epsilon, tied embeddings, the
// vocabulary, activation checkpointing and the attention kernel.
struct DecoderOptions {
  std::int64_t seq_len, hidden_dim, num_layers, num_heads;
  double initializer_range, layer_norm_epsilon;
  bool tie_word_embeddings;
  std::int64_t vocab_size;  // 0: from the tokenizer
  RematPolicy remat;
  ComponentRef attention;  // for CreateContext::create<AttentionKernel>
  std::string path;        // of the options in the config ("model"), for messages
};

// A decoder with grouped-query attention, rotary positions and a gated MLP (Llama, Gemma).
struct RotaryDecoderOptions : DecoderOptions {
  std::int64_t intermediate_dim, num_kv_heads;
  std::int64_t head_dim;        // 0 after reading when the option is null: the family derives it
  std::int64_t sliding_window;  // 0: none
};

template <class Config>
requires std::derived_from<Config, DecoderOptions>
class DecoderSchema : public OptionBinding<Config> {
  static constexpr bool rotary = std::derived_from<Config, RotaryDecoderOptions>;
  using Base = OptionBinding<Config>;

 public:
  DecoderSchema() {
    this->then([](Config& c, const Options& o) { c.path = options_path(o); });
  }

  BoundOption<Config, std::int64_t> seq_len(std::int64_t default_value, std::string doc) {
    return extent("seq_len", &DecoderOptions::seq_len, default_value, std::move(doc), max_model_seq_len);
  }
  BoundOption<Config, std::int64_t> hidden_dim(std::int64_t default_value, std::string doc) {
    return extent("hidden_dim", &DecoderOptions::hidden_dim, default_value, std::move(doc), max_model_width);
  }
  BoundOption<Config, std::int64_t> num_layers(std::int64_t default_value, std::string doc) {
    return extent("num_layers", &DecoderOptions::num_layers, default_value, std::move(doc), max_model_layers);
  }
  BoundOption<Config, std::int64_t> num_heads(std::int64_t default_value, std::string doc) {
    return extent("num_heads", &DecoderOptions::num_heads, default_value, std::move(doc), max_model_heads);
  }
  BoundOption<Config, double> initializer_range() {
    return this
        ->field("initializer_range", &DecoderOptions::initializer_range, 0.02,
                "Standard deviation of the normal initialisation.")
        .min(0.0);
  }
  BoundOption<Config, double> layer_norm_epsilon(double default_value, std::string doc) {
    return this->field("layer_norm_epsilon", &DecoderOptions::layer_norm_epsilon, default_value, std::move(doc))
        .min(0.0);
  }
  BoundOption<Config, bool> tie_word_embeddings(bool default_value, std::string doc) {
    return this->field("tie_word_embeddings", &DecoderOptions::tie_word_embeddings, default_value, std::move(doc));
  }
  BoundOption<Config, std::int64_t> vocab_size() {
    return this
        ->field("vocab_size", &DecoderOptions::vocab_size, std::nullopt, "Vocabulary size; null takes the tokenizer's.")
        .min(1)
        .max(static_cast<double>(max_model_vocab_size))
        .null_as(0);
  }
  BoundOption<Config, RematPolicy> remat() {
    return this->choice(
        "remat", &DecoderOptions::remat, RematPolicy::none,
        {{"none", RematPolicy::none}, {"full", RematPolicy::full}, {"save_dots", RematPolicy::save_dots}}, remat_doc);
  }
  BoundOption<Config, ComponentRef> attention() {
    return this->component("attention", &DecoderOptions::attention, "attention", "auto",
                           "The attention kernel, by name or {type: NAME, ...}; auto: the one the backend's device "
                           "prefers (flash on the host; docs/attention-kernels.md#auto).");
  }

  // RotaryDecoderOptions' own.
  BoundOption<Config, std::int64_t> intermediate_dim(std::int64_t default_value, std::string doc) requires rotary {
    return extent("intermediate_dim", &RotaryDecoderOptions::intermediate_dim, default_value, std::move(doc),
                  max_model_width);
  }
  BoundOption<Config, std::int64_t> num_kv_heads(std::int64_t default_value, std::string doc) requires rotary {
    return extent("num_kv_heads", &RotaryDecoderOptions::num_kv_heads, default_value, std::move(doc), max_model_heads);
  }
  // std::nullopt: null unless given, read as 0 (the family derives it in a then() step).
  BoundOption<Config, std::int64_t> head_dim(std::optional<std::int64_t> default_value,
                                             std::string doc) requires rotary {
    auto bound = default_value
                     ? this->field("head_dim", &RotaryDecoderOptions::head_dim, *default_value, std::move(doc))
                     : this->field("head_dim", &RotaryDecoderOptions::head_dim, std::nullopt, std::move(doc));
    return bound.min(2).max(static_cast<double>(max_model_width)).null_as(0);
  }
  // Null (none) reads as 0; std::nullopt: none unless given.
  BoundOption<Config, std::int64_t> sliding_window(std::optional<std::int64_t> default_value,
                                                   std::string doc) requires rotary {
    auto bound =
        default_value
            ? this->field("sliding_window", &RotaryDecoderOptions::sliding_window, *default_value, std::move(doc))
            : this->field("sliding_window", &RotaryDecoderOptions::sliding_window, std::nullopt, std::move(doc));
    return bound.min(1).null_as(0);
  }

 private:
  template <class Owner>
  BoundOption<Config, std::int64_t> extent(const char* name, std::int64_t Owner::*member, std::int64_t default_value,
                                           std::string doc, std::int64_t max) {
    return this->field(name, member, default_value, std::move(doc)).min(1).max(static_cast<double>(max));
  }
};

}  // namespace loom::models
