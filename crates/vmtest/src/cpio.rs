//! A writer for the "newc" cpio format, the only archive format the kernel unpacks as an
//! initramfs. Written here (thirty lines) rather than shelling out to `cpio` so the archive is
//! byte-for-byte reproducible: same inputs, same bytes, whatever the files' mtimes or inode numbers.
//! The kernel accepts the archive uncompressed, so no compressor is needed either.

/// One archive member. Paths are relative (`bin/busybox`), parents listed before children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    CharDev {
        path: String,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// The archive bytes for `entries`, followed by the trailer the format requires.
pub fn archive(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        // Inode numbers only need to be distinct (equal ones would be taken for hard links).
        let ino = i as u32 + 1;
        match entry {
            Entry::Dir { path } => member(&mut out, ino, S_IFDIR | 0o755, path, &[], (0, 0)),
            Entry::File { path, mode, data } => {
                member(&mut out, ino, S_IFREG | mode, path, data, (0, 0))
            }
            Entry::CharDev {
                path,
                mode,
                major,
                minor,
            } => member(&mut out, ino, S_IFCHR | mode, path, &[], (*major, *minor)),
        }
    }
    member(&mut out, 0, 0, "TRAILER!!!", &[], (0, 0));
    out
}

fn member(out: &mut Vec<u8>, ino: u32, mode: u32, name: &str, data: &[u8], rdev: (u32, u32)) {
    let nlink = if mode & S_IFDIR == S_IFDIR { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime: fixed, for reproducible archives
        data.len() as u32,
        0, // dev major
        0, // dev minor
        rdev.0,
        rdev.1,
        name.len() as u32 + 1, // the name's size counts its NUL
        0,                     // checksum, unused by newc
    ];
    out.extend_from_slice(b"070701");
    for field in fields {
        out.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

/// Header + name and the data are each padded to a multiple of four bytes.
fn pad4(out: &mut Vec<u8>) {
    while out.len() & 3 != 0 {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_member_has_the_newc_header_padded_name_and_padded_data() {
        let bytes = archive(&[Entry::File {
            path: "init".into(),
            mode: 0o755,
            data: b"#!x".to_vec(),
        }]);
        let header = std::str::from_utf8(&bytes[..110]).unwrap();
        assert_eq!(&header[..6], "070701");
        assert_eq!(&header[6..14], "00000001", "ino");
        assert_eq!(&header[14..22], "000081ed", "regular file, 0755");
        assert_eq!(&header[54..62], "00000003", "file size");
        assert_eq!(&header[94..102], "00000005", "name size with its NUL");
        // 110 header bytes + "init\0" = 115, padded to 116; the data follows, padded to 120.
        assert_eq!(&bytes[110..116], b"init\0\0");
        assert_eq!(&bytes[116..120], b"#!x\0");
        assert_eq!(
            &bytes[120..126],
            b"070701",
            "the trailer starts right after"
        );
        assert!(bytes.ends_with(&[0]) && bytes.len() & 3 == 0);
        let trailer = std::str::from_utf8(&bytes[120 + 110..120 + 120]).unwrap();
        assert_eq!(trailer, "TRAILER!!!");
    }

    #[test]
    fn a_character_device_carries_its_numbers_in_rdev() {
        let bytes = archive(&[Entry::CharDev {
            path: "dev/console".into(),
            mode: 0o600,
            major: 5,
            minor: 1,
        }]);
        let header = std::str::from_utf8(&bytes[..110]).unwrap();
        assert_eq!(&header[14..22], "00002180");
        assert_eq!(&header[78..86], "00000005", "rdev major");
        assert_eq!(&header[86..94], "00000001", "rdev minor");
    }

    #[test]
    fn the_same_entries_give_the_same_bytes() {
        let entries = vec![
            Entry::Dir { path: "bin".into() },
            Entry::File {
                path: "bin/a".into(),
                mode: 0o644,
                data: vec![1, 2, 3, 4, 5],
            },
        ];
        assert_eq!(archive(&entries), archive(&entries));
    }
}
