// Each file named on the command line read as TorchServe's ConfigManager reads config.properties:
// java.util.Properties.load(InputStream), ISO-8859-1. One line per key: the file's index, then the key and the value
// as hex UTF-16 units (no text escaping to get wrong), then Boolean.parseBoolean(value); "error" for a file load()
// refuses. Run as `java LoadProperties.java FILE...` (JDK 11+ single-file source launch).
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;

public class LoadProperties {
    public static void main(String[] args) throws Exception {
        for (int index = 0; index < args.length; index++) {
            Properties properties = new Properties();
            try (InputStream in = Files.newInputStream(Path.of(args[index]))) {
                properties.load(in);
            } catch (IllegalArgumentException malformed) {
                System.out.println(index + "\terror");
                continue;
            }
            for (String key : properties.stringPropertyNames()) {
                String value = properties.getProperty(key);
                System.out.println(index + "\t" + hex(key) + "\t" + hex(value) + "\t" + Boolean.parseBoolean(value));
            }
        }
    }

    static String hex(String text) {
        StringBuilder out = new StringBuilder("x");  // never empty: an empty key or value survives a split at tabs
        for (char c : text.toCharArray()) {
            out.append(String.format("%04x", (int) c));
        }
        return out.toString();
    }
}
