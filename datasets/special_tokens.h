// datasets/special_tokens.h — data.special_tokens: the user-defined pieces a tokenizer troupe
// trains holds beside <|endoftext|> (ids 2, 3, ... in the order given; datasets/tokenizer.h).
#pragma once

#include <string>
#include <vector>

namespace troupe {

// data.special_tokens split at commas, blanks (spaces, tabs) trimmed; "" or blanks: none.
// Each token must be marked off from ordinary text, as Megatron-LM's and Hugging Face's
// special tokens are (<|im_start|>, [INST], <s>): SentencePiece matches a user-defined piece
// wherever its text occurs, inside words too, so "ab." or "->" would swallow the corpus's own.
// Errors: UserError naming the token and the fix for
//   - an empty entry ("a,,b");
//   - <|endoftext|>, <unk> or a byte piece (<0xNN>), which every tokenizer already holds;
//   - a token listed twice;
//   - one holding a blank (core/text.h space_at: U+00A0, U+3000, zero-widths...) or another
//     whitespace character, at which the tokenizer splits before it matches (never produced);
//   - one of letters, digits and '_' only, or of one character;
//   - one that does not begin with an opening bracket (< [ { ( « ‹ 〈 《 「 『 【 〔 ⟨ ⟦ and
//     their full-width forms) and end with a closing one (> ] } ) » › 〉 》 」 』 】 〕 ⟩ ⟧ ...),
//     with a letter or digit (of any script) between: "..", "->", "||", "ab.", "e"+U+0301.
std::vector<std::string> parse_special_tokens(const std::string& list);

}  // namespace troupe
