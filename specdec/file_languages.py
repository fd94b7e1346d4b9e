"""A file's language by its extension: what the prompts (language detection) and the repository wing (which files
are source code) both read, so it sits below both. Torch-free, no imports."""

EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascriptreact", ".ts": "typescript", ".mts": "typescript", ".tsx": "typescriptreact",
    ".go": "go", ".rs": "rust", ".java": "java", ".c": "c", ".h": "cpp", ".cc": "cpp", ".cpp": "cpp",
    ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".rb": "ruby", ".lua": "lua", ".sh": "shellscript",
    ".md": "markdown", ".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml",
}
