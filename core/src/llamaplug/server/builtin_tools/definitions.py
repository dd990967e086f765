"""Each tool as GET /tools lists it: llama-server's display name, write permission and OpenAI function."""

from __future__ import annotations

from typing import Any

from .search import MAX_RESULTS
from .shell import MAX_OUTPUT, MAX_TIMEOUT


def _fn(name: str, description: str, properties: dict[str, tuple[str, str]], required: list[str]
        ) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": {
        k: {"type": t, "description": d} for k, (t, d) in properties.items()}}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_GLOB = ("Recursively search for files matching a glob pattern under a directory. Automatically skips files ignored by "
         ".gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, "
         "build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any "
         "depth. A pattern containing '/' matches the full relative path; unless already anchored with \"**/\" or a "
         "leading '/', it is automatically prefixed with \"**/\". Use type=\"dir\" or \"all\" to also list "
         "directories; directory entries are suffixed with '/' in the output. Note: directory listings do not apply "
         ".gitignore filtering.")
_GREP = ("Search for a pattern in files under a path. Returns matching lines with file paths (and, unless searching a "
         "single file, paths relative to the given directory). Automatically skips files ignored by .gitignore (when "
         "the directory is inside a git repo) and common junk directories (.git, node_modules, build, dist, etc.) "
         "otherwise. include/exclude: a pattern with no '/' matches the basename at any depth; a pattern containing "
         "'/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).")
_EDIT_ITEMS = {"type": "object", "properties": {
    "old_text": {"type": "string", "description": "Exact text to find; must be unique in the file and must not "
                                                  "overlap with other edits"},
    "new_text": {"type": "string", "description": "Text to replace old_text with"}},
    "required": ["old_text", "new_text"]}

# name: (display name, writes, definition)
TOOLS: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "read_file": ("Read file", False, _fn(
        "read_file", "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
        "each line is prefixed with its line number (e.g. \"1\u2192...\").",
        {"path": ("string", "Path to the file"),
         "start_line": ("integer", "First line to read, 1-based (default: 1)"),
         "end_line": ("integer", "Last line to read, 1-based inclusive (default: end of file)"),
         "append_loc": ("boolean", "Prefix each line with its line number")}, ["path"])),
    "file_glob_search": ("File search", False, _fn(
        "file_glob_search", _GLOB,
        {"path": ("string", "Base directory to search in"),
         "include": ("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
         "exclude": ("string", "Glob pattern for files to exclude"),
         "type": ("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
         "max_depth": ("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct "
                                  "children only)"),
         "limit": ("integer", f"Maximum number of results to return, capped at {MAX_RESULTS} (default "
                              f"{MAX_RESULTS})")}, ["path"])),
    "grep_search": ("Grep search", False, _fn(
        "grep_search", _GREP,
        {"path": ("string", "File or directory to search in"),
         "pattern": ("string", "Pattern to search for (regular expression unless literal is true)"),
         "include": ("string", "Glob pattern to filter files (default: **)"),
         "exclude": ("string", "Glob pattern to exclude files"),
         "return_line_numbers": ("boolean", "If true, include line numbers in results"),
         "literal": ("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
         "ignore_case": ("boolean", "Case-insensitive search (default: false)"),
         "context_lines": ("integer", "Number of lines of context to show before and after each match (default: "
                                      "0)")}, ["path", "pattern"])),
    "exec_shell_command": ("Execute shell command", True, _fn(
        "exec_shell_command", "Execute a shell command and return its output (stdout and stderr combined).",
        {"command": ("string", "Shell command to execute"),
         "timeout": ("integer", f"Timeout in seconds (default 10, max {MAX_TIMEOUT})"),
         "max_output_size": ("integer", f"Maximum output size in bytes (default {MAX_OUTPUT})")}, ["command"])),
    "write_file": ("Write file", True, _fn(
        "write_file", "Write content to a file, creating it (including parent directories) if it does not exist. May "
        "use with edit_file for more complex edits.",
        {"path": ("string", "Path of the file to write"), "content": ("string", "Content to write")},
        ["path", "content"])),
    "edit_file": ("Edit file", True, {"type": "function", "function": {
        "name": "edit_file",
        "description": "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and "
                       "is matched against the original content, not incrementally. Merge nearby changes into one "
                       "edit instead of overlapping edits. Use write_file to replace the whole file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path to the file to edit"},
            "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                      "items": _EDIT_ITEMS}},
            "required": ["path", "edits"]}}}),
    "get_info": ("Get Runtime Info", False, _fn(
        "get_info", "Returns runtime info: the OS name/version and the current working directory", {}, [])),
}


def listing(names: list[str]) -> list[dict[str, Any]]:
    """GET /tools' entries of the enabled built-in tools (server_tool::to_json)."""
    return [{"display_name": TOOLS[n][0], "tool": n, "type": "server", "permissions": {"write": TOOLS[n][1]},
             "uses_cwd": True, "definition": TOOLS[n][2]} for n in names]
