// A document placed after the question: when several requests ask different questions about the same
// document, the question is the first thing that differs, so the document (the long part) is never
// reused. Found per paragraph: a paragraph that recurs in different user messages is shared material
// (a document, or fixed boilerplate); a message with unique text (the question) in front of 200+
// characters of shared material has its document after the question. The fix moves the shared
// paragraphs to the front, in their order, and the unique ones after them.
#include <unordered_map>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {
namespace {

constexpr size_t kMinDocumentChars = 200;  // shared text after the question that is worth a block or more

bool blank_line(std::string_view l) { return l.find_first_not_of(" \t\r") == std::string_view::npos; }

// Paragraphs: runs of non-blank lines.
std::vector<std::string_view> paragraphs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0, start = std::string_view::npos, end = 0;
  while (pos <= s.size()) {
    const size_t nl = std::min(s.find('\n', pos), s.size());
    const std::string_view line = s.substr(pos, nl - pos);
    if (blank_line(line)) {
      if (start != std::string_view::npos) out.push_back(s.substr(start, end - start));
      start = std::string_view::npos;
    } else {
      if (start == std::string_view::npos) start = pos;
      end = nl;
    }
    pos = nl + 1;
  }
  if (start != std::string_view::npos) out.push_back(s.substr(start, end - start));
  return out;
}

// In how many different user messages each paragraph occurs (1 or "2 or more").
class Recurrence {
 public:
  explicit Recurrence(const Log& log) {
    for (const auto& r : log)
      for (const auto& m : r.messages) {
        if (m.role != "user") continue;
        const uint64_t msg = text_hash(m.content);
        for (std::string_view p : paragraphs(m.content)) {
          auto [it, fresh] = seen_.try_emplace(text_hash(p), Seen{msg, false});
          if (!fresh && it->second.message != msg) it->second.recurs = true;
        }
      }
  }
  bool recurs(std::string_view paragraph) const {
    auto it = seen_.find(text_hash(paragraph));
    return it != seen_.end() && it->second.recurs;
  }

 private:
  struct Seen {
    uint64_t message;
    bool recurs;
  };
  std::unordered_map<uint64_t, Seen> seen_;
};

struct Plan {
  std::string reordered;           // shared paragraphs first
  std::vector<uint64_t> moved;     // the shared paragraphs that came after unique text
  size_t moved_chars = 0;
};

std::optional<Plan> plan(std::string_view content, const Recurrence& rec) {
  const auto paras = paragraphs(content);
  std::vector<std::string_view> shared, unique;
  size_t shared_after_unique = 0;
  Plan p;
  for (std::string_view x : paras) {
    if (rec.recurs(x)) {
      shared.push_back(x);
      if (!unique.empty()) {
        shared_after_unique += x.size();
        p.moved.push_back(text_hash(x));
      }
    } else {
      unique.push_back(x);
    }
  }
  if (shared_after_unique < kMinDocumentChars) return std::nullopt;
  p.moved_chars = shared_after_unique;
  for (auto* part : {&shared, &unique})
    for (std::string_view x : *part) p.reordered += std::string(p.reordered.empty() ? "" : "\n\n") + std::string(x);
  return p;
}

}  // namespace

Detection detect_document_order(const Log& log) {
  const Recurrence rec(log);
  Detection d;
  // moved paragraph -> the first (request, message) that has it after unique text
  std::unordered_map<uint64_t, std::pair<size_t, size_t>> first_after_question;
  for (size_t i = 0; i < log.size(); ++i) {
    bool flagged = false;
    for (size_t m = 0; m < log[i].messages.size(); ++m) {
      const Message& msg = log[i].messages[m];
      if (msg.role != "user") continue;
      const auto p = plan(msg.content, rec);
      if (!p) continue;
      if (!flagged) d.affected.push_back(i);
      flagged = true;
      for (uint64_t h : p->moved) {
        auto [it, fresh] = first_after_question.try_emplace(h, i, m);
        if (!fresh && it->second.first != i && !d.example) {
          const auto [j, jm] = it->second;
          d.example = Example{j, i, "messages[" + std::to_string(m) + "] (user)", log[j].messages[jm].content, msg.content,
                              "both put a shared document (" + std::to_string(p->moved_chars) +
                                  " characters) after a question of their own"};
        }
      }
    }
  }
  return d;
}

Log normalise_document_order(Log log) {
  const Recurrence rec(log);
  for (auto& r : log)
    for (auto& m : r.messages)
      if (m.role == "user")
        if (auto p = plan(m.content, rec)) m.content = std::move(p->reordered);
  return log;
}

}  // namespace kvpack::analyze
