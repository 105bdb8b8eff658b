//! GritLM's instruction span: its embedding prompts open with an instruction
//! (`<|user|>\nINSTRUCTION\n<|embed|>\n`, or `<|embed|>\n` alone) that the mean leaves out. The
//! published `gritlm.GritLM.encode` masks the tokens of the instruction tokenized alone; vLLM's
//! `GritLMMeanPool` finds the same span in the prompt's ids by token pattern, which is what a
//! server can do with whatever prompt it is sent. This reproduces vLLM's search:
//! - no BOS first: nothing is skipped;
//! - `▁< | user | > <0x0A>` right after BOS: the span ends after the first
//!   `<0x0A> < | embed | > <0x0A>`;
//! - otherwise it ends after the first `▁< | embed | > <0x0A>`;
//! - no such pattern: BOS alone is skipped.

/// The token ids of the pattern's pieces in one tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstructionSpan {
    bos: u32,
    user: Vec<u32>,
    embed_after_newline: Vec<u32>,
    embed: Vec<u32>,
}

impl InstructionSpan {
    /// From the tokenizer's ids of the SentencePiece pieces vLLM names; `None` when one is missing
    /// (no prompt could then hold the pattern).
    pub fn from_pieces(id: impl Fn(&str) -> Option<u32>) -> Option<Self> {
        let ids = |pieces: &[&str]| pieces.iter().map(|p| id(p)).collect::<Option<Vec<u32>>>();
        Some(InstructionSpan {
            bos: id("<s>")?,
            user: ids(&["▁<", "|", "user", "|", ">", "<0x0A>"])?,
            embed_after_newline: ids(&["<0x0A>", "<", "|", "embed", "|", ">", "<0x0A>"])?,
            embed: ids(&["▁<", "|", "embed", "|", ">", "<0x0A>"])?,
        })
    }

    /// How many tokens at the start of `ids` are instruction (BOS included).
    pub fn len_in(&self, ids: &[u32]) -> usize {
        if ids.first() != Some(&self.bos) {
            return 0;
        }
        let pattern = match ids.get(1..1 + self.user.len()) == Some(&self.user[..]) {
            true => &self.embed_after_newline,
            false => &self.embed,
        };
        ids.windows(pattern.len()).skip(1).position(|w| w == &pattern[..]).map_or(1, |i| 1 + i + pattern.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span() -> InstructionSpan {
        let pieces = ["<s>", "▁<", "|", "user", ">", "<0x0A>", "<", "embed"];
        InstructionSpan::from_pieces(|p| pieces.iter().position(|x| *x == p).map(|i| i as u32)).unwrap()
    }

    #[test]
    fn finds_the_instruction_as_vllm_does() {
        // <s> ▁< | user | > \n I \n < | embed | > \n text
        let with_user = [0, 1, 2, 3, 2, 4, 5, 99, 5, 6, 2, 7, 2, 4, 5, 42, 43];
        assert_eq!(span().len_in(&with_user), 15);
        // <s> ▁< | embed | > \n text
        assert_eq!(span().len_in(&[0, 1, 2, 7, 2, 4, 5, 42]), 7);
        assert_eq!(span().len_in(&[0, 42, 43]), 1, "no pattern: BOS alone");
        assert_eq!(span().len_in(&[42, 1, 2, 7, 2, 4, 5]), 0, "no BOS: nothing");
        assert!(InstructionSpan::from_pieces(|_| None).is_none());
    }
}
