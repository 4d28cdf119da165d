// Megatron's moe_layer_freq as an expression string (search/spec.h: ParseMoeLayerFreq).
#include <cctype>
#include <string>
#include <vector>

#include "search/limits.h"
#include "search/spec.h"
#include "search/text.h"

namespace remat::search {

namespace {
// A recursive-descent reader of Megatron's moe_layer_freq expressions:
//   expr := term ('+' term)* ; term := atom ('*' int)? ; atom := list | '(' expr ')'
//   list := '[' int (',' int)* ']'
class LayerFreqReader {
 public:
  explicit LayerFreqReader(const std::string& text) : text_(text) {}

  bool Read(std::vector<int>* out) {
    if (!Expr(out)) return false;
    Skip();
    return pos_ == text_.size();
  }

 private:
  void Skip() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Int(long long* v) {
    Skip();
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9' && pos_ - start < 9) {
      ++pos_;
    }
    if (pos_ == start) return false;
    *v = std::stoll(text_.substr(start, pos_ - start));
    return true;
  }
  bool Atom(std::vector<int>* out) {
    if (Eat('(')) {
      // Parentheses nest only as deep as a recipe writes them: a bound keeps the recursion (and
      // the stack) small whatever the text.
      if (++depth_ > 8) return false;
      const bool ok = Expr(out) && Eat(')');
      --depth_;
      return ok;
    }
    if (!Eat('[')) return false;
    do {
      long long v = 0;
      if (!Int(&v)) return false;
      out->push_back(static_cast<int>(v));
    } while (Eat(','));
    return Eat(']');
  }
  bool Term(std::vector<int>* out) {
    std::vector<int> atom;
    if (!Atom(&atom)) return false;
    long long times = 1;
    if (Eat('*') && !Int(&times)) return false;
    // The pattern has one entry per layer: a repetition past the layer limit is refused.
    if (times * static_cast<long long>(atom.size()) + static_cast<long long>(out->size()) >
        limits::kMaxLayers) {
      return false;
    }
    for (long long i = 0; i < times; ++i) out->insert(out->end(), atom.begin(), atom.end());
    return true;
  }
  bool Expr(std::vector<int>* out) {
    do {
      if (!Term(out)) return false;
    } while (Eat('+'));
    return true;
  }

  const std::string& text_;
  size_t pos_ = 0;
  int depth_ = 0;
};
}  // namespace

StatusOr<MoeLayerFreq> ParseMoeLayerFreq(const std::string& text, const std::string& field) {
  MoeLayerFreq freq;
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos &&
      text.size() < 10) {
    freq.every = std::stoi(text);
    return freq;
  }
  if (!LayerFreqReader(text).Read(&freq.pattern)) {
    return InvalidArgument(field +
                           ": must be an integer, a list of 0/1 per layer or Megatron's "
                           "expression of lists (e.g. \"([0]*3+[1]*58)\"), got " +
                           QuoteForError(text, limits::kMaxQuotedValueBytes));
  }
  return freq;
}

}  // namespace remat::search
