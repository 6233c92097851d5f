// core/toml_text.h — checks on TOML text before the parser sees it (a config file or one
// --set value), and the shape of a string literal for --set's messages.
#pragma once
#include <cstddef>
#include <string>

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

}  // namespace troupe
