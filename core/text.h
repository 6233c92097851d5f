// core/text.h — text that came from outside (files, flags, peers) made safe to show on a
// terminal or in a log line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// `s` with every byte a terminal could act on written as \xNN: C0 controls (except
// newline and tab when keep_newlines), DEL, C1 controls (U+0080..U+009F) and bytes
// that are not valid UTF-8; characters a terminal shows as nothing or that reorder the line
// (format characters such as U+200B, U+FEFF, the bidi controls U+202A..U+202E and U+2066..
// U+2069; U+2028/U+2029) and spaces other than U+0020 that read as one (U+00A0, U+2000..U+200A,
// U+202F, U+205F, U+3000) as \u{XXXX}. Other valid UTF-8 passes unchanged. When the result
// would exceed max_bytes, it is cut at a character boundary and "..." is appended.
std::string printable(std::string_view s, bool keep_newlines = true, size_t max_bytes = std::string::npos);

// The offset of the first control character in `s` (C0 controls, newline and tab
// included; DEL; the C1 controls U+0080..U+009F as UTF-8 C2 80..9F, e.g. U+009B, a CSI),
// or npos: a value that holds one (a path, a flag, a config string) is refused.
size_t find_control(std::string_view s);

// A parser's message for the user, without the library's tags: nlohmann::json's
// "[json.exception.parse_error.101] parse error at line 1, column 2: ..." loses its
// "[json.exception.*] " prefix; made printable (printable(), one line, at most 300 bytes).
// The caller names the file or option and the fix around it.
std::string parser_message(std::string_view what);

// The wide encoding text starting with `head` is in: "UTF-32" or "UTF-16" by its byte-order
// mark (FF FE 00 00 / 00 00 FE FF; FF FE / FE FF), or "UTF-16" for BOM-less text whose
// first bytes alternate ASCII letters and NULs (either byte order); "" otherwise. So a
// message can name the encoding and the `iconv -f <it> -t UTF-8` that converts it.
const char* wide_encoding(std::string_view head);

// The end of the sentence that refuses a path starting with '~' (troupe expands none, and a
// folder named '~' would be made in the current directory): "which troupe does not expand
// (<why no shell did>): write the full path, e.g. /root/x" (the example for "~" and "~/x").
std::string tilde_refusal(std::string_view value, std::string_view why_unexpanded);

// A byte count for a sentence, in the unit that shows it: "512 bytes", "8.0 KiB", "3.4 MiB",
// "1.2 GiB" (binary units, one decimal).
std::string size_text(uint64_t bytes);

// The UTF-8 length of a blank or invisible character at s[i]: an ASCII space or tab, U+00A0,
// U+1680, U+180E, U+2000..U+200D (spaces and zero-widths), U+2028/U+2029, U+202A..U+202F
// (bidi controls, a narrow space), U+205F, U+2060, U+2066..U+2069, U+3000 or U+FEFF; 0 when none.
size_t space_at(std::string_view s, size_t i);

// True when `s` is not empty and holds only blanks (space_at): a path of them names a folder
// nobody can see or meant.
bool blank_text(std::string_view s);

// True when a '/'-separated part of `path` is blank_text: a/\u00A0/b names a folder nobody sees.
bool blank_part(std::string_view path);

// The length (1..4) of the valid UTF-8 character at s[i], its code point stored in *cp;
// 0 when s[i] starts none (a stray continuation byte, an overlong or cut sequence, a
// surrogate) or starts a C1 control (U+0080..U+009F). i < s.size(). Never throws.
size_t utf8_at(std::string_view s, size_t i, uint32_t* cp);
// As utf8_at, but a C1 control is a valid character too: for finding where text stops being
// UTF-8 at all (a decoder's view), not where it stops being safe to show.
size_t valid_utf8_at(std::string_view s, size_t i, uint32_t* cp);

// True when `s` starts or ends with a blank (space_at): " x " as a path is a typing slip.
bool padded_text(std::string_view s);

// The names of `known` nearest to `name` by edit distance (Levenshtein: insertions, deletions
// and substitutions of bytes, each costing 1), those at distance <= max_distance only, the
// nearest first (ties in `known`'s order), at most max_count of them; the first 80 bytes of
// `name` are compared. For "did you mean" hints on a misspelled key or variable name
// (train.stepz -> train.steps). Never throws except std::bad_alloc.
std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string_view>& known,
                                       size_t max_distance = 3, size_t max_count = 3);

// `parts` joined with `sep` between them: join({"a", "b"}, " or ") is "a or b"; "" for none.
std::string join(const std::vector<std::string>& parts, std::string_view sep);

}  // namespace troupe
