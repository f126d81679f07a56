# Helpers of the CLI test scripts (sourced): a .npy writer. Needs `scratch` and nothing else.

# npy FILE ROWS COLS [BYTES [FILL]]: a float32 .npy file of ROWS x COLS, its data BYTES bytes
# (default ROWS * COLS * 4) of FILL (an octal byte, default 000: zeros; 074: every float
# 0x3c3c3c3c = 0.0115).
npy() {
  npy_dict "$1" "{'descr': '<f4', 'fortran_order': False, 'shape': ($2, $3), }" \
    "${4:-$(($2 * $3 * 4))}" "${5:-000}"
}

# npy_dict FILE DICT BYTES [FILL]: an .npy file (format 1.0) whose header holds DICT as written,
# then BYTES data bytes of FILL (default 000).
npy_dict() {
  local dict=$2
  local pad=$(((64 - (10 + ${#dict} + 1) % 64) % 64))
  local hlen=$((${#dict} + 1 + pad))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf %02x $((hlen & 255)))\\x$(printf %02x $((hlen >> 8)))"
    printf '%s%*s\n' "$dict" "$pad" ''
    head -c "$3" /dev/zero | tr '\0' "\\${4:-000}"
  } >"$1"
}
