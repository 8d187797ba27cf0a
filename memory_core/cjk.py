"""The CJK character ranges, defined once, as regex character-class bodies (`rf"[{HAN}]"`)."""

#: Han ideographs: Extension A, the unified block, the compatibility block.
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
#: Hiragana and katakana (n-grammed with Han by the text indexes).
KANA = "\u3040-\u30ff"
#: Characters a tokenizer spends about one token on: CJK symbols, kana, Han, Hangul, full-width forms.
WIDE = "\u3000-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
