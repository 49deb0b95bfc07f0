// A Java producer (the kafka-clients jar of the pinned Kafka) for the proxy's tests.
// Usage: java -cp "<kafka jars>/*" ProxyProducer.java BOOTSTRAP TOPIC IDEMPOTENCE COMPRESSION [PROPS]
// PROPS: a properties file of further producer settings (security.protocol, sasl.jaas.config, ...).
// Reads one record per stdin line: PARTITION<TAB>KEY<TAB>VALUE[<TAB>NAME=VALUE...]; KEY "-" is null.
// Prints one line per record: "OK <partition> <offset>" or "ERR <exception> <message>".
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ProxyProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("enable.idempotence", args[2]);
        props.put("compression.type", args[3]);
        props.put("acks", "all");
        props.put("delivery.timeout.ms", "30000");
        props.put("request.timeout.ms", "10000");
        props.put("max.block.ms", "20000");
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        if (args.length > 4) {
            try (FileInputStream extra = new FileInputStream(args[4])) {
                props.load(extra);
            }
        }
        String topic = args[1];
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) continue;
                String[] f = line.split("\t", -1);
                byte[] key = f[1].equals("-") ? null : f[1].getBytes(StandardCharsets.UTF_8);
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(
                    topic, Integer.parseInt(f[0]), key, f[2].getBytes(StandardCharsets.UTF_8));
                for (int i = 3; i < f.length; i++) {
                    int eq = f[i].indexOf('=');
                    rec.headers().add(f[i].substring(0, eq), f[i].substring(eq + 1).getBytes(StandardCharsets.UTF_8));
                }
                futures.add(producer.send(rec));
            }
            producer.flush();
            for (Future<RecordMetadata> fut : futures) {
                try {
                    RecordMetadata md = fut.get();
                    System.out.println("OK " + md.partition() + " " + md.offset());
                } catch (Exception e) {
                    Throwable cause = e.getCause() != null ? e.getCause() : e;
                    System.out.println("ERR " + cause.getClass().getSimpleName() + " " + cause.getMessage());
                }
            }
        }
    }
}
