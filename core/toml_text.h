// core/toml_text.h — checks on TOML text before the parser sees it (a config file or one
// --set value), the shape of a string literal for --set's messages, and numbers as typed.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace troupe {

// toml++ parses dotted keys, [a.b.c] headers and nested arrays/inline tables by recursion: a
// key of 50,000 parts overflowed the stack (SIGSEGV in every command reading the config).
// troupe's keys have two parts and its values little nesting, so `text` is refused past 64
// levels, counted outside strings and comments: dots in a key or header, open brackets and
// braces. `where` names the source ("config file 'F'", "--set KEY"); `set`: the text is one
// --set value (no line to name). Throws UserError naming the line (a file) and the fix.
void check_toml_nesting(const std::string& text, const std::string& where, bool set = false);

// True when `value` holds a TOML string literal opened at `first` ('...' or "...", not a
// triple-quoted one) that is closed with more than blanks after it: "1f1b" x. Never throws.
bool text_after_quotes(const std::string& value, size_t first);

// The sentence for a config file toml++ cannot parse: `why` (parser_message of toml++'s
// description) at `line`, corrected where toml++ misleads: a number past a double's range
// (not "fix the syntax"), a 64-bit integer overflow, an invalid UTF-8 byte (its own line,
// and the iconv that converts the file).
std::string toml_error_sentence(std::string_view text, const std::string& path, size_t line, const std::string& why);

// True when the decimal `text` reads as a double `d` with other significant digits: more
// digits than a double holds (0.99999999999999999 reads as 1), or an underflow to 0
// (1e-400). False for text that is no plain decimal (inf, 0x10) and for a non-finite d.
bool reads_as_other_digits(std::string_view text, double d);

// The decimal token of a TOML value at 1-based (line, column) of `text` ("0.99999999999999999"
// in "beta2 = 0.99999999999999999"); "" past the text.
std::string token_at(std::string_view text, size_t line, size_t column);

// Whether a number as typed has a leading zero TOML refuses ("02", "-007", "02e-3", "00.5";
// not "0", "0.5", "0e3" or "0x1F").
bool leading_zero(const std::string& s);
// The number as typed with its leading zeros dropped ("-007" -> "-7", "00.5" -> "0.5").
std::string without_leading_zeros(const std::string& s);
// Whether `s` is written as an integer TOML knows: decimal digits with an optional sign, or
// 0x / 0o / 0b and that base's digits (underscores between digits allowed), an integer even
// when it is too large for TOML's 64 bits.
bool integer_text(const std::string& s);

}  // namespace troupe
